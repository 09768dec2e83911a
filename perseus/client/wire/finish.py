"""A job's normal end, as its ranks tell it: every rank meets the others, then the job's
first leader tells the coordinator (``POST /finish``) and logs what the job did.

A finish that cannot be told (a rank that died, a process group already destroyed, a
coordinator that does not answer) is a warning, never an error: the coordinator then marks
the job failed at its round timeout.
"""

from __future__ import annotations

import logging
from typing import Any

from perseus.client.bootstrap import all_ranks_reach
from perseus.client.wire.coordinator import CoordinatorClient
from perseus.errors import CoordinatorError
from perseus.protocol import JobOutcome, RoundStatus

__all__ = ["end_line", "finish_job"]

logger = logging.getLogger(__name__)


def finish_job(
    dist: Any,
    coordinator: CoordinatorClient,
    *,
    job_id: str,
    rank: int,
    registrar: int,
    world_size: int,
    timeout_s: float,
    status: RoundStatus | None = None,
) -> JobOutcome | None:
    """Wait for every rank (at most `timeout_s`), then, on the `registrar`, tell the
    coordinator the job finished and log what the job did (its answer, else the last
    `status`); the answer (None elsewhere, or when it was not told)."""
    told = True
    if world_size > 1:
        why_not = all_ranks_reach(dist, timeout_s)
        if why_not is not None and dist.is_initialized():
            if rank == registrar:
                logger.warning(
                    "Job %s: not telling the coordinator that it finished: %s; it will "
                    "be marked failed at the coordinator's round timeout",
                    job_id,
                    why_not,
                )
            told = False
    if rank != registrar:
        return None
    outcome = None
    if told:
        try:
            outcome = coordinator.finish_job(job_id)
        except CoordinatorError as exc:
            logger.warning("Job %s: could not tell the coordinator it finished: %s", job_id, exc)
    logger.info("Perseus: job %s ends: %s", job_id, end_line(outcome, status))
    return outcome


def end_line(outcome: JobOutcome | None, status: RoundStatus | None) -> str:
    """What the job did, one line: the coordinator's answer to the finish, else the last
    status it sent."""
    if outcome is None:
        summary = status.summary if status is not None else None
        return summary or "the coordinator sent no figures"
    total = (
        f"{outcome.energy_j:,.0f} J over {outcome.iterations_measured} measured "
        "iteration(s), all GPUs"
    )
    if outcome.measured_saving is None or outcome.measured_slowdown is None:
        return f"no plan was measured against all-max; {total}"
    return (
        f"measured saving {outcome.measured_saving:.2%} at {outcome.measured_slowdown:+.2%} "
        f"slowdown against its all-max rounds (medians); {total}"
    )
