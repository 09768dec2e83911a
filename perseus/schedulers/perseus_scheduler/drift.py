"""Drift of the job's all-max figures away from those its profile was taken with.

A plan is chosen from a profile measured once; over weeks the GPUs drift (the H200 of
docs/measurements/h200-2026-11-26 drew 7 % more over a day at the same work: temperature,
firmware, neighbours). The guard's reference rounds follow the drift for the plan's check
(its window holds the newest all-max rounds only), but a profile that no longer describes
the GPUs chooses worse plans and predicts wrong savings. `DriftWatch` compares the median
of the newest all-max reference rounds with the median of the all-max rounds around the
profile; past `threshold` (relative, in iteration time or in energy) it says what drifted,
and `Perseus` profiles the job again (``reprofile`` event) and deploys the plan of the new
profile. The statistic is the guard's (`perseus.domain.robust`: medians).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from perseus.domain.robust import median
from perseus.schedulers.perseus_scheduler.guard import RoundFigures

__all__ = ["DEFAULT_REPROFILE_DRIFT", "DRIFT_WINDOW", "DriftWatch"]

DEFAULT_REPROFILE_DRIFT = 0.05
"""Relative drift of the all-max iteration time or energy that re-profiles a job: above the
guard's usual tolerance (budget + 0.5 point), below the 7 % a day an H200 showed."""


DRIFT_WINDOW = 20
"""Reference rounds the newest median is taken over: with a reference round every 10th
round, 200 rounds (minutes to half an hour), so that a passing disturbance (a host stall, a
neighbour's burst) that moves a few reference rounds moves no median; drift moves them all."""


class DriftWatch:
    """Watches the all-max reference rounds for drift from the profile's.

    Args:
        threshold: Relative drift that calls for a new profile (0: never).
        rounds: Reference rounds the newest median is taken over (at least 3).
    """

    def __init__(self, threshold: float, rounds: int = DRIFT_WINDOW) -> None:
        self.threshold = threshold
        self.rounds = max(3, rounds)
        self.reference: tuple[float, float] | None = None
        """(median iteration time s, median energy J) of the all-max rounds the profile was
        taken with; None: not known yet (taken from the first `rounds` reference rounds)."""
        self.recent: deque[RoundFigures] = deque(maxlen=self.rounds)

    def arm(self, baseline: Sequence[RoundFigures]) -> None:
        """A profile's plan was deployed: its all-max rounds (`baseline`) are the reference."""
        self.recent.clear()
        self.reference = None
        if len(baseline) >= 1:
            self.reference = (
                median(r.iteration_time_s for r in baseline),
                median(r.energy_j for r in baseline),
            )

    def reset(self) -> None:
        """A new profile is being taken: no reference until it is deployed (`arm`)."""
        self.recent.clear()
        self.reference = None

    def observe(self, figures: RoundFigures) -> str | None:
        """An all-max reference round while a plan runs. Returns what drifted and by how
        much once the newest `rounds` reference rounds' median is past `threshold` from the
        reference; None otherwise (and always with `threshold` 0)."""
        self.recent.append(figures)
        if len(self.recent) < self.rounds or self.threshold <= 0:
            return None
        now = (
            median(r.iteration_time_s for r in self.recent),
            median(r.energy_j for r in self.recent),
        )
        if self.reference is None:  # a resumed job: the first rounds are the reference
            self.reference = now
            self.recent.clear()
            return None
        drifted = []
        for name, unit, ref, cur in (
            ("iteration time", "s", self.reference[0], now[0]),
            ("energy per iteration", "J", self.reference[1], now[1]),
        ):
            change = cur / ref - 1.0 if ref > 0 else 0.0
            if abs(change) > self.threshold:
                drifted.append(
                    f"all-max {name} {change:+.1%} ({ref:.4g} → {cur:.4g} {unit}, median of "
                    f"the newest {len(self.recent)} reference rounds)"
                )
        if not drifted:
            return None
        return (
            "the GPUs drifted from the profile: "
            + "; ".join(drifted)
            + f" (threshold {self.threshold:.0%})"
        )
