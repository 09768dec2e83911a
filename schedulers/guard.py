"""The promise, checked by measurement: a deployed plan against the job's own all-max rounds.

A plan is chosen for a slowdown budget from a model (the profile, the measured clock-switch
and hop latencies). Whether it keeps the budget, and saves energy at all, is a measurement:
`PromiseGuard` compares the deployed plan's rounds with the job's all-max rounds and says
when to move.

Figures are per round (`RoundFigures`: the job's iteration time, the slowest rank's median,
so that one iteration the host stalled does not decide a check, and its mean energy per
iteration, every GPU). The comparison uses medians: over the all-max
baseline rounds, and over a window of deployed rounds after the plan settled. The
tolerance is not a constant: it is `z` standard errors of the difference of the two medians,
from the baseline's own round-to-round spread (``1.2533 σ/√n`` per median, σ the
baseline's standard deviation, at least its resolution floor).

```
      deploy ──▶ SETTLING (1 round) ──▶ WATCHING (window rounds) ──▶ check
check: slowdown > budget + tolerance           ──▶ move faster (or to all-max)
       energy not below all-max by a tolerance ──▶ extend the window (up to 3×), then all-max
       otherwise                                ──▶ KEPT (the plan stays; checks go on)
```

Moves only go towards faster plans and end at all-max, which is never left: the guard
cannot oscillate, and it settles within ``max_moves × (1 + 3·window)`` rounds of a
deployment. Stragglers (other pipelines slowed on purpose) and rounds that ran anything
but the guarded plan are not counted.
"""

from __future__ import annotations

import enum
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "GuardDecision",
    "GuardState",
    "PromiseGuard",
    "RoundFigures",
    "median_figures",
    "relative_spread",
]

_MEDIAN_EFFICIENCY = 1.2533
"""Standard error of a median over that of a mean, for normal samples (√(π/2))."""
_MAX_EXTENSIONS = 2
"""A window that is inconclusive on energy is extended this many times before deciding."""


@dataclass(frozen=True)
class RoundFigures:
    """One round, measured: the job's iteration time (slowest rank's median, s) and energy
    per iteration (every GPU of the job, J)."""

    round: int
    iteration_time_s: float
    energy_j: float


def median_figures(rounds: Sequence[RoundFigures]) -> tuple[float, float]:
    """(median iteration time, median energy) of some rounds."""
    return (
        statistics.median(r.iteration_time_s for r in rounds),
        statistics.median(r.energy_j for r in rounds),
    )


def relative_spread(values: Sequence[float]) -> float:
    """Sample standard deviation over the median (0 for fewer than two values)."""
    if len(values) < 2:
        return 0.0
    mid = statistics.median(values)
    return statistics.stdev(values) / mid if mid > 0 else math.inf


class GuardState(enum.Enum):
    """Where the guard is with the plan it watches (see the module docstring)."""

    SETTLING = "settling"
    WATCHING = "watching"
    KEPT = "kept"
    ALL_MAX = "all-max"


@dataclass(frozen=True)
class GuardDecision:
    """What a check concluded; `move` is None when the plan stays."""

    move: str | None
    """None, "faster" (a faster frontier point) or "all-max"."""
    reason: str
    measured_slowdown: float
    measured_saving: float
    slowdown_tolerance: float
    saving_tolerance: float
    rounds: tuple[int, int]
    """First and last round of the window measured."""


class PromiseGuard:
    """Watches the plan deployed for a slowdown `budget` (see the module docstring).

    Args:
        budget: The allowed slowdown against all-max (a fraction).
        window: Deployed rounds per check.
        z: Standard errors of the medians' difference that count as a real difference.
        max_moves: Moves to faster plans before the guard goes straight to all-max.
        baseline_window: The newest all-max rounds a check compares with (older ones age
            out: a machine drifts, so the plan is compared with all-max measured near it).
        resolution: The smallest relative spread a measurement can have (a floor on the
            baseline's σ: the timer's and the energy counter's resolution over a round).
    """

    def __init__(
        self,
        *,
        budget: float,
        window: int = 4,
        z: float = 3.0,
        max_moves: int = 1,
        resolution: float = 1e-4,
        baseline_window: int = 1000,
    ) -> None:
        self.budget = budget
        self.window = window
        self.z = z
        self.max_moves = max_moves
        self.resolution = resolution
        self.baseline_window = baseline_window
        self.baseline: list[RoundFigures] = []
        self.state = GuardState.ALL_MAX
        self.moves = 0
        self.predicted_slowdown = 0.0
        self._rounds: list[RoundFigures] = []
        self._extensions = 0
        self.last: GuardDecision | None = None
        """The latest check's figures (None before the first)."""

    # ------------------------------------------------------------------ inputs
    def add_baseline(self, figures: RoundFigures) -> None:
        """An all-max round (the reference of every comparison; the newest
        `baseline_window` count)."""
        self.baseline.append(figures)
        del self.baseline[: -self.baseline_window]

    def watch(self, predicted_slowdown: float) -> None:
        """A plan predicted at `predicted_slowdown` was deployed: watch it from the next round."""
        self.predicted_slowdown = predicted_slowdown
        self.state = GuardState.SETTLING
        self._rounds = []
        self._extensions = 0

    def hold(self) -> None:
        """All-max runs from now on (terminal)."""
        self.state = GuardState.ALL_MAX
        self._rounds = []

    # ------------------------------------------------------------------ tolerance
    def tolerances(self, window_rounds: int) -> tuple[float, float]:
        """(slowdown, saving) tolerances for a window of `window_rounds` rounds."""
        n_base = max(1, len(self.baseline))
        scale = _MEDIAN_EFFICIENCY * math.sqrt(1 / n_base + 1 / max(1, window_rounds))
        sigma_t = max(
            relative_spread([r.iteration_time_s for r in self.baseline]), self.resolution
        )
        sigma_e = max(relative_spread([r.energy_j for r in self.baseline]), self.resolution)
        return self.z * sigma_t * scale, self.z * sigma_e * scale

    def measured(self, rounds: Sequence[RoundFigures]) -> tuple[float, float] | None:
        """(slowdown, saving) of `rounds` against the baseline medians (None: no baseline)."""
        if not self.baseline or not rounds:
            return None
        t_base, e_base = median_figures(self.baseline)
        t, e = median_figures(rounds)
        return t / t_base - 1.0, 1.0 - e / e_base

    # ------------------------------------------------------------------ rounds
    def observe(self, figures: RoundFigures) -> GuardDecision | None:
        """A round of the watched plan; returns a decision when a check ran."""
        if self.state is GuardState.ALL_MAX:
            return None
        if self.state is GuardState.SETTLING:
            # The first round after a change mixes clocks and waits on the switch.
            self.state = GuardState.WATCHING
            return None
        self._rounds.append(figures)
        needed = self.window * (1 + self._extensions)
        if self.state is GuardState.KEPT:
            needed = self.window
            if len(self._rounds) > self.window:
                self._rounds = self._rounds[-self.window :]
        if len(self._rounds) < needed:
            return None
        return self._check()

    def _check(self) -> GuardDecision | None:
        figures = self.measured(self._rounds)
        if figures is None:
            return None
        slowdown, saving = figures
        tol_t, tol_e = self.tolerances(len(self._rounds))
        span = (self._rounds[0].round, self._rounds[-1].round)

        def decide(move: str | None, reason: str) -> GuardDecision:
            self.last = GuardDecision(move, reason, slowdown, saving, tol_t, tol_e, span)
            return self.last

        if slowdown > self.budget + tol_t:
            excess = (
                f"measured slowdown {slowdown:+.2%} is over the {self.budget:.2%} budget "
                f"by more than the measurement's tolerance ({tol_t:.2%}; predicted "
                f"{self.predicted_slowdown:+.2%})"
            )
            if self.moves >= self.max_moves:
                self.hold()
                return decide("all-max", excess)
            self.moves += 1
            self.watch(self.predicted_slowdown)  # the caller names the new plan's prediction
            return decide("faster", excess)
        if saving < -tol_e:
            self.hold()
            return decide(
                "all-max",
                f"measured energy is {-saving:.2%} above all-max (tolerance {tol_e:.2%})",
            )
        if saving <= tol_e and self.state is GuardState.WATCHING:
            if self._extensions < _MAX_EXTENSIONS:
                self._extensions += 1
                return decide(
                    None,
                    f"measured saving {saving:.2%} is within the tolerance ({tol_e:.2%}): "
                    "measuring longer",
                )
            self.hold()
            return decide(
                "all-max",
                f"measured saving {saving:.2%} is not above the measurement's tolerance "
                f"({tol_e:.2%}) after {len(self._rounds)} rounds: the plan's saving cannot "
                "be told from noise",
            )
        first = self.state is GuardState.WATCHING
        self.state = GuardState.KEPT
        self._rounds = []
        return decide(
            None,
            ("keeps the plan" if first else "still keeps the plan")
            + f": measured saving {saving:.2%} (±{tol_e:.2%}), slowdown {slowdown:+.2%} "
            f"(budget {self.budget:.2%} ± {tol_t:.2%})",
        )
