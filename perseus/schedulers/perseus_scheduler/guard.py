"""The promise, checked by measurement: a deployed plan against the job's own all-max rounds.

A plan is chosen for a slowdown budget from a model (the profile, the measured clock-switch
and hop latencies). Whether it keeps the budget, and saves energy at all, is a measurement:
`PromiseGuard` compares the deployed plan's rounds with the job's all-max rounds and says
when to move. It is meant to be left running for weeks: every history it keeps is a bounded
window, one disturbed round does not widen its tolerance, the tolerance has a ceiling, and a
fall-back to all-max is not for life.

Figures are per round (`RoundFigures`, `perseus.domain.robust`: the slowest rank's median
iteration time, so that one iteration the host stalled does not decide a check, and the
job's mean energy per iteration, every GPU), compared as medians: of the newest all-max
rounds (`baseline_window`, `ROUND_WINDOW` by default: the rounds before profiling, then the
reference rounds every `reference_every`-th round of a plan, then a cool-down's) and of a
window of deployed rounds after the plan settled. The report, ``/jobs`` and the tests take
the same medians. The tolerance is `z` standard errors of the difference of the two medians,
``1.2533 σ √(1/n_all-max + 1/n_plan)``, σ the all-max rounds' robust spread (1.4826 × their
median absolute deviation over their median, at least `resolution`); the slowdown tolerance
never exceeds ``budget + SLOWDOWN_TOLERANCE_FLOOR``.

```
      deploy ──▶ SETTLING (1 round) ──▶ WATCHING (window rounds) ──▶ check
check: slowdown > budget + tolerance           ──▶ move faster (max_moves), then fall back
       energy not below all-max by a tolerance ──▶ extend the window (up to 3×), then fall back
       otherwise                                ──▶ KEPT (the plan stays; checks go on)
fall back ──▶ COOLING: all-max for COOLDOWN_ROUNDS · 2^(fall-backs − 1) rounds (at most
              MAX_COOLDOWN_ROUNDS), each a fresh all-max round ──▶ re-deploy, watched again,
              when those rounds let the plan's saving show (else cool down again, longer)
hold (a check before deployment failed) ──▶ ALL_MAX (terminal)
```

Within one deployment moves only go towards faster plans and end at all-max: the guard
cannot oscillate, and it settles within ``max_moves × (1 + 3·window)`` rounds of a
deployment. Re-deployments come only after a cool-down that doubles at every fall-back, so a
plan that keeps failing costs at most ``(1 + max_moves)(1 + 3·window)`` rounds per
cool-down; a plan kept `MAX_COOLDOWN_ROUNDS` rounds in a row resets the back-off. Stragglers
(other pipelines slowed on purpose) and rounds that ran anything but the guarded plan are
not counted.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from perseus.domain.robust import ROUND_WINDOW, median, robust_spread

__all__ = [
    "COOLDOWN_ROUNDS",
    "MAX_COOLDOWN_ROUNDS",
    "SLOWDOWN_TOLERANCE_FLOOR",
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

SLOWDOWN_TOLERANCE_FLOOR = 0.005
"""The slowdown tolerance never exceeds ``budget + SLOWDOWN_TOLERANCE_FLOOR``. The tolerance
is what the measurement cannot tell from noise; a job that noisy cannot verify its budget,
and an uncapped tolerance let a plan measured at +5 % pass a 1 % budget (4.02 % on a user's job).
Capped at the budget itself, a plan measured at more than twice its budget (plus this floor)
always moves, however noisy the all-max rounds. The floor, half a point, keeps a zero or
tiny budget from turning timer jitter into moves: about 5× the round-to-round time spread of
a quiet GPU job (0.1 %)."""

COOLDOWN_ROUNDS = ROUND_WINDOW
"""All-max rounds after a first fall-back before the plan is re-deployed: a whole window of
fresh all-max rounds, so that the re-deployed plan is compared with all-max measured after
whatever disturbed it (a host stall, a neighbour's job, a thermal swing), none from before."""

MAX_COOLDOWN_ROUNDS = COOLDOWN_ROUNDS * 2**8
"""The cool-down doubles at every fall-back up to this (5120 rounds, about 1.5 h at the ~1 s
rounds the energy counters need): a plan that keeps failing is retried ~16 times a day, each
retry running it at most ``(1 + max_moves)(1 + 3·window)`` rounds (26 by default), under
0.5 % of the rounds. A plan kept this many rounds in a row resets the back-off."""


@dataclass(frozen=True)
class RoundFigures:
    """One round, measured: the job's iteration time (slowest rank's median, s) and energy
    per iteration (every GPU of the job, J)."""

    round: int
    iteration_time_s: float
    energy_j: float


def median_figures(rounds: Iterable[RoundFigures]) -> tuple[float, float]:
    """(median iteration time, median energy) of some rounds (a bounded window: the
    statistic of `perseus.domain.robust`)."""
    kept = list(rounds)
    return median(r.iteration_time_s for r in kept), median(r.energy_j for r in kept)


def relative_spread(values: Sequence[float]) -> float:
    """The rounds' relative spread the guard uses (`perseus.domain.robust.robust_spread`:
    1.4826 × MAD over the median; 0 for fewer than two values)."""
    return robust_spread(values)


class GuardState(enum.Enum):
    """Where the guard is with the plan it watches (see the module docstring)."""

    SETTLING = "settling"
    WATCHING = "watching"
    KEPT = "kept"
    COOLING = "cooling"
    """Fallen back: all-max runs and is measured afresh; the plan is re-deployed after."""
    ALL_MAX = "all-max"
    """Held (terminal): a check before deployment failed, or nothing to re-deploy."""


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

    Every history is bounded (`baseline`: `baseline_window` rounds; the watched rounds: a
    check's longest window), so a job of ~600k rounds a week holds as much as one of 20.
    """

    def __init__(
        self,
        *,
        budget: float,
        window: int = 4,
        z: float = 3.0,
        max_moves: int = 1,
        resolution: float = 1e-4,
        baseline_window: int = ROUND_WINDOW,
    ) -> None:
        self.budget = budget
        self.window = window
        self.z = z
        self.max_moves = max_moves
        self.resolution = resolution
        self.baseline_window = baseline_window
        self.baseline: deque[RoundFigures] = deque(maxlen=baseline_window)
        """The newest all-max rounds (oldest first)."""
        self.state = GuardState.ALL_MAX
        self.moves = 0
        self.predicted_slowdown = 0.0
        self._rounds: deque[RoundFigures] = deque(maxlen=window * (1 + _MAX_EXTENSIONS))
        self._extensions = 0
        self.fallbacks = 0
        """Fall-backs since the back-off was last reset (the next cool-down's exponent)."""
        self.cooldown_left = 0
        """All-max rounds left before a re-deployment (while `COOLING`)."""
        self._cool_settling = False
        self.kept_rounds = 0
        """Rounds the plan ran kept in a row (`MAX_COOLDOWN_ROUNDS` resets the back-off)."""
        self.last: GuardDecision | None = None
        """The latest check's figures (None before the first)."""

    # ------------------------------------------------------------------ inputs
    def add_baseline(self, figures: RoundFigures) -> None:
        """An all-max round (the reference of every comparison; the newest
        `baseline_window` count)."""
        self.baseline.append(figures)

    def watch(self, predicted_slowdown: float) -> None:
        """A plan predicted at `predicted_slowdown` was deployed: watch it from the next round."""
        self.predicted_slowdown = predicted_slowdown
        self.state = GuardState.SETTLING
        self._rounds.clear()
        self._extensions = 0
        self.kept_rounds = 0

    def hold(self) -> None:
        """All-max runs from now on (terminal: a check before deployment failed)."""
        self.state = GuardState.ALL_MAX
        self._rounds.clear()

    # ------------------------------------------------------------------ cool-down
    @property
    def cooling(self) -> bool:
        """Fallen back: all-max runs until the plan is re-deployed."""
        return self.state is GuardState.COOLING

    @staticmethod
    def cooldown_length(fallbacks: int) -> int:
        """Rounds of the cool-down after the `fallbacks`-th fall-back in a row."""
        return min(MAX_COOLDOWN_ROUNDS, COOLDOWN_ROUNDS * 2 ** max(0, min(fallbacks - 1, 30)))

    def fall_back(self) -> int:
        """The plan broke its promise: all-max runs for a cool-down (doubling at every
        fall-back, see `cooldown_length`) and is measured afresh; returns its rounds."""
        self.fallbacks += 1
        self.cooldown_left = self.cooldown_length(self.fallbacks)
        self.state = GuardState.COOLING
        self._cool_settling = True
        self._rounds.clear()
        self.kept_rounds = 0
        return self.cooldown_left

    def cool(self, figures: RoundFigures) -> bool:
        """An all-max round of the cool-down: a fresh all-max round (but the first, which
        mixes the plan's clocks with the switch to all-max). True when the cool-down is over
        and the plan is due again (`redeploy_problem` says whether it may)."""
        if not self.cooling:
            return False
        if self._cool_settling:
            self._cool_settling = False
        else:
            self.add_baseline(figures)
        self.cooldown_left = max(0, self.cooldown_left - 1)
        return self.cooldown_left == 0

    def redeploy_problem(self, predicted_saving: float) -> str | None:
        """Why the fresh all-max rounds do not support re-deploying a plan predicted to save
        `predicted_saving` (None: they do): the guard could not tell its saving from their
        spread over its longest window, and would only fall back again."""
        if len(self.baseline) < 2:
            return "fewer than 2 all-max rounds to compare a plan with"
        _, tol_e = self.tolerances(self.window * (1 + _MAX_EXTENSIONS))
        if predicted_saving <= tol_e:
            return (
                f"the plan's predicted saving ({predicted_saving:.2%}) is not above the "
                f"all-max rounds' spread allows the guard to tell ({tol_e:.2%})"
            )
        return None

    def cool_longer(self) -> int:
        """Re-deployment declined: another cool-down, one back-off step longer; its rounds."""
        self.fallbacks += 1
        self.cooldown_left = self.cooldown_length(self.fallbacks)
        return self.cooldown_left

    def redeploy(self, predicted_slowdown: float) -> None:
        """The plan runs again after a cool-down: watched as a new deployment (its moves
        to faster plans allowed again; the back-off stays until it is kept long enough)."""
        self.moves = 0
        self.watch(predicted_slowdown)

    # ------------------------------------------------------------------ persistence
    def to_state(self) -> dict[str, Any]:
        """What a restarted coordinator needs to go on guarding (bounded: the newest
        `baseline_window` all-max rounds and a few numbers); JSON-serialisable."""
        return {
            "state": self.state.value,
            "budget": self.budget,
            "moves": self.moves,
            "fallbacks": self.fallbacks,
            "cooldown_left": self.cooldown_left,
            "kept_rounds": self.kept_rounds,
            "predicted_slowdown": self.predicted_slowdown,
            "baseline": [[r.round, r.iteration_time_s, r.energy_j] for r in self.baseline],
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Go on from `to_state`'s `state` (`ValueError`/`TypeError`/`KeyError` when it is
        not one). A plan that was watched is watched again from its next round (it settles
        anew: the restart may have stalled a round); a cool-down goes on."""
        guard_state = GuardState(state["state"])
        baseline = [
            RoundFigures(int(n), float(t), float(e))
            for n, t, e in state["baseline"]
            if math.isfinite(float(t)) and math.isfinite(float(e)) and float(t) > 0
        ]
        budget = float(state["budget"])
        numbers = {k: int(state[k]) for k in ("moves", "fallbacks", "cooldown_left")}
        if budget < 0 or not math.isfinite(budget) or min(numbers.values()) < 0:
            raise ValueError(f"not a guard's state: {dict(state)!r}")
        self.budget = budget
        self.baseline.clear()
        self.baseline.extend(baseline)
        self.moves = numbers["moves"]
        self.fallbacks = numbers["fallbacks"]
        self.predicted_slowdown = float(state.get("predicted_slowdown", 0.0))
        self._rounds.clear()
        self._extensions = 0
        self.kept_rounds = max(0, int(state.get("kept_rounds", 0)))
        if guard_state is GuardState.COOLING:
            self.state = GuardState.COOLING
            self.cooldown_left = max(1, numbers["cooldown_left"])
            self._cool_settling = True
        elif guard_state is GuardState.ALL_MAX:
            self.hold()
        else:
            kept = self.kept_rounds
            self.watch(self.predicted_slowdown)
            self.kept_rounds = kept

    # ------------------------------------------------------------------ tolerance
    def tolerances(self, window_rounds: int) -> tuple[float, float]:
        """(slowdown, saving) tolerances for a window of `window_rounds` rounds: `z`
        standard errors of the medians' difference from the all-max rounds' robust spread;
        the slowdown's at most ``budget + SLOWDOWN_TOLERANCE_FLOOR``."""
        n_base = max(1, len(self.baseline))
        scale = _MEDIAN_EFFICIENCY * math.sqrt(1 / n_base + 1 / max(1, window_rounds))
        sigma_t = max(relative_spread([r.iteration_time_s for r in self.baseline]), self.resolution)
        sigma_e = max(relative_spread([r.energy_j for r in self.baseline]), self.resolution)
        tol_t = min(self.z * sigma_t * scale, self.slowdown_tolerance_cap)
        return tol_t, self.z * sigma_e * scale

    @property
    def slowdown_tolerance_cap(self) -> float:
        """The most the slowdown tolerance can be: the budget plus `SLOWDOWN_TOLERANCE_FLOOR`."""
        return self.budget + SLOWDOWN_TOLERANCE_FLOOR

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
        if self.state in (GuardState.ALL_MAX, GuardState.COOLING):
            return None
        if self.state is GuardState.SETTLING:
            # The first round after a change mixes clocks and waits on the switch.
            self.state = GuardState.WATCHING
            return None
        self._rounds.append(figures)
        needed = self.window * (1 + self._extensions)
        if self.state is GuardState.KEPT:
            needed = self.window
            self.kept_rounds += 1
            if self.kept_rounds >= MAX_COOLDOWN_ROUNDS:
                self.fallbacks = 0  # kept long enough: the next fall-back starts afresh
            while len(self._rounds) > self.window:
                self._rounds.popleft()
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
                self.fall_back()
                return decide("all-max", excess)
            self.moves += 1
            self.watch(self.predicted_slowdown)  # the caller names the new plan's prediction
            return decide("faster", excess)
        if saving < -tol_e:
            self.fall_back()
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
            self.fall_back()
            return decide(
                "all-max",
                f"measured saving {saving:.2%} is not above the measurement's tolerance "
                f"({tol_e:.2%}) after {len(self._rounds)} rounds: the plan's saving cannot "
                "be told from noise",
            )
        first = self.state is GuardState.WATCHING
        self.state = GuardState.KEPT
        self._rounds.clear()
        return decide(
            None,
            ("keeps the plan" if first else "still keeps the plan")
            + f": measured saving {saving:.2%} (±{tol_e:.2%}), slowdown {slowdown:+.2%} "
            f"(budget {self.budget:.2%} ± {tol_t:.2%})",
        )
