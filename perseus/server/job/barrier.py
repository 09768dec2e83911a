"""A job's lifecycle (`JobPhase`) and one scheduling round's barrier (`Round`): the pieces
of `perseus.server.job` that hold no job state."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field

from perseus.domain.layout import Leaders
from perseus.protocol import FrequencySchedule, JobRecord, RankInfo

__all__ = ["JobPhase", "Round", "fail_round", "ranks_text", "timeout_message"]


class JobPhase(enum.Enum):
    """A job's lifecycle.

    REGISTERING → RUNNING        when the last rank registers and its scheduler is built
    REGISTERING → FAILED         the scheduler could not be built, or a round timed out
    RUNNING     → FAILED         a round timed out or the scheduler raised
    RUNNING     → FINISHED       its rank 0 closed normally (``POST /finish``)
    FAILED and FINISHED are terminal: every later call gets the failure (status and message)
    or 409 (finished; the results of the job's last round are still taken). Eviction (idle
    too long) removes the job in any state; an ended job is forgotten `ended_job_ttl_s`
    after it ended (`perseus.server.job_manager`).
    """

    REGISTERING = "registering"
    RUNNING = "running"
    FAILED = "failed"
    FINISHED = "finished"

    @property
    def ended(self) -> bool:
        """FAILED or FINISHED: the job runs no more rounds."""
        return self in (JobPhase.FAILED, JobPhase.FINISHED)


@dataclass(eq=False)
class Round:
    """One scheduling round's barrier."""

    number: int
    future: asyncio.Future[dict[int, FrequencySchedule]]
    asked: set[int] = field(default_factory=set)
    timer: asyncio.TimerHandle | None = None
    completing: bool = False


def ranks_text(ranks: list[int]) -> str:
    """``[0, 2-5, 9]``: sorted ranks with consecutive runs collapsed (readable for 1000s)."""
    parts: list[str] = []
    start = prev = None
    for r in sorted(ranks):
        if prev is not None and r == prev + 1:
            prev = r
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = r
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return "[" + ", ".join(parts) + "]"


def fail_round(rnd: Round, error: BaseException) -> None:
    """Fail a round's future, marking the exception retrieved (there may be no waiter)."""
    if rnd.timer is not None:
        rnd.timer.cancel()
    if not rnd.future.done():
        rnd.future.set_exception(error)
        rnd.future.exception()


def timeout_message(
    info: JobRecord,
    leaders: Leaders | None,
    ranks: dict[int, RankInfo],
    rnd: Round,
    timeout_s: float,
) -> str:
    """Why round `rnd` of job `info` timed out: who never asked, who never registered."""
    message = f"Round {rnd.number} of job {info.job_id} timed out after {timeout_s:g} s: "
    if leaders is None:
        never_asked = sorted(set(range(info.world_size)) - rnd.asked)
        unregistered = sorted(set(range(info.world_size)) - set(ranks))
        message += f"rank(s) {ranks_text(never_asked)} never asked for their schedule"
        if unregistered:
            message += f"; rank(s) {ranks_text(unregistered)} never registered"
    else:
        never_asked = sorted(set(ranks) - rnd.asked)
        message += f"leader rank(s) {ranks_text(never_asked)} never asked for their schedule"
        seen = {(i.pp_rank, i.dp_rank) for i in ranks.values()}
        missing = [
            f"stage {p} replica {d}"
            for p in range(info.pp_degree)
            for d in leaders.replicas
            if (p, d) not in seen
        ]
        if missing:
            shown = ", ".join(missing[:8]) + (
                f" and {len(missing) - 8} more" if len(missing) > 8 else ""
            )
            message += f"; the leader(s) of {shown} never registered"
    return message
