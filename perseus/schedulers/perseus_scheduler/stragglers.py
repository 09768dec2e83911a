"""Stragglers: when one data-parallel pipeline runs slow, the others need not hurry.

`StragglerTracker` holds what `Perseus` knows of slow pipelines — announced with ``POST
/straggler`` (sticky until a slowdown of 1.0 is announced) or detected from results (a
pipeline's instructions run more than `threshold` slower, relative to what its plan
predicts, than the fastest pipeline's, for `rounds` rounds in a row; recovered after as
many rounds within the threshold) — and answers which pipelines should run which slower,
cheaper plan.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from perseus.domain.plan import Plan
from perseus.errors import ConfigurationError
from perseus.schedulers.measurement import RoundMeasurement
from perseus.schedulers.perseus_scheduler.plan_model import PlanModel

__all__ = ["StragglerTracker"]

logger = logging.getLogger(__name__)


class StragglerTracker:
    """Announced and detected stragglers of one job.

    Args:
        job_id: For messages.
        dp_degree: The job's data-parallel pipelines.
        threshold: Relative slowness that marks a straggler.
        rounds: Rounds in a row to detect a straggler or its recovery.
    """

    def __init__(self, job_id: str, dp_degree: int, *, threshold: float, rounds: int) -> None:
        self.job_id = job_id
        self.dp_degree = dp_degree
        self.threshold = threshold
        self.rounds = rounds
        self.announced: dict[int, float] = {}
        self.detected: dict[int, float] = {}
        self._streak: dict[int, int] = {}
        self._recover_streak: dict[int, int] = {}

    def announce(self, dp_rank: int, slowdown: float) -> None:
        """Pipeline `dp_rank` runs `slowdown`× its normal time (1.0: recovered)."""
        if not 0 <= dp_rank < self.dp_degree:
            raise ConfigurationError(
                f"dp_rank {dp_rank} is out of range: job {self.job_id} has "
                f"dp_degree {self.dp_degree} (valid 0..{self.dp_degree - 1})"
            )
        if not (math.isfinite(slowdown) and slowdown >= 1.0):
            raise ConfigurationError(
                f"slowdown must be a finite number >= 1.0 (1.0 = recovered), got {slowdown!r}"
            )
        if slowdown == 1.0:
            self.announced.pop(dp_rank, None)
        else:
            self.announced[dp_rank] = slowdown
        logger.info(
            "Job %s: straggler announcement dp_rank=%d slowdown=%.3f",
            self.job_id,
            dp_rank,
            slowdown,
        )

    def stragglers(self) -> dict[int, float]:
        """Data-parallel rank → slowdown, announced or detected (announcements win)."""
        return {**self.detected, **self.announced}

    def detect(
        self,
        m: RoundMeasurement,
        num_stages: int,
        expected_busy_s: Callable[[int], list[float] | None],
    ) -> bool:
        """Update the detected stragglers from a round; True when they changed.

        `expected_busy_s(dp)`: per stage, the computation time the plan pipeline `dp` ran
        predicts (None: nothing to compare with).
        """
        if self.dp_degree < 2:
            return False
        ratio: dict[int, float] = {}
        for dp in range(self.dp_degree):
            exp = expected_busy_s(dp)
            if exp is None:
                return False
            ratio[dp] = max(m.busy_s[dp, s] / exp[s] for s in range(num_stages) if exp[s] > 0)
        base = min(ratio.values())
        changed = False
        for dp, r in ratio.items():
            rel = r / base
            if rel > 1.0 + self.threshold:
                self._recover_streak[dp] = 0
                self._streak[dp] = self._streak.get(dp, 0) + 1
                known = self.detected.get(dp)
                if self._streak[dp] >= self.rounds and (
                    known is None or abs(rel - known) > self.threshold * known
                ):
                    self.detected[dp] = rel
                    changed = True
            else:
                self._streak[dp] = 0
                if dp in self.detected:
                    self._recover_streak[dp] = self._recover_streak.get(dp, 0) + 1
                    if self._recover_streak[dp] >= self.rounds:
                        del self.detected[dp]
                        changed = True
        if changed:
            logger.info("Job %s: detected stragglers %s", self.job_id, self.detected)
        return changed

    def others_plan(self, model: PlanModel | None, chosen: Plan) -> dict[int, Plan]:
        """Per pipeline that does not straggle, the cheapest frontier plan that still meets
        the worst straggler's time ({}: no straggler, or no frontier to slow the others
        down)."""
        stragglers = self.stragglers()
        if not stragglers:
            return {}
        if model is None or model.frontier is None:
            logger.warning(
                "Job %s: straggler(s) %s but no frontier to slow the others down",
                self.job_id,
                stragglers,
            )
            return {}
        deadline = max(stragglers.values()) * chosen.iteration_time
        plan = model.choose(deadline_s=deadline)
        logger.info(
            "Job %s: straggler(s) %s: other pipelines run T=%.4f s (≤ %.4f s), E=%.1f J",
            self.job_id,
            stragglers,
            plan.iteration_time,
            deadline,
            plan.energy,
        )
        return {dp: plan for dp in range(self.dp_degree) if dp not in stragglers}
