"""How far `Perseus`'s profiling is, what it cost, and what the job measured so far.

`ProfilingProgress` counts the job's measured joules and iterations (every GPU), the
sweep's cost against the all-max rounds measured beside it, the rounds still to come (for
progress notes and `RoundStatus.profiling_rounds`), and sizes the rounds measured against
one another to hold enough refreshes of the GPUs' energy counters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from perseus.protocol import ProfilingResult
from schedulers.guard import RoundFigures, median_figures
from schedulers.sweep import InstructionSweep
from schedulers.sweep_levels import counter_round_steps

__all__ = ["ProfilingProgress"]


class ProfilingProgress:
    """One job's profiling progress and measured totals.

    Args:
        lead_in: All-max rounds issued before the sweep (the first is a warm-up).
        windows: The sweep fits energies to the counters' windows (its rounds are sized).
        round_ticks: Counter refreshes a profiling round holds at least.
    """

    def __init__(self, lead_in: int, *, windows: bool, round_ticks: int) -> None:
        self.lead_in = lead_in
        self.windows = windows
        self.round_ticks = round_ticks
        self.energy_j = 0.0
        """Measured joules of every GPU of the job so far."""
        self.iterations = 0
        self.round_iterations = 0
        self.cost_s = 0.0
        """The sweep's rounds' time beyond all-max so far (s)."""
        self.cost_j = 0.0
        """The sweep's rounds' energy beyond all-max so far (J)."""
        self.last_iteration_s: float | None = None
        self.sweep_rounds: list[tuple[list[list[int]], float]] = []
        """The sweep's rounds: their clocks per rank and measured iteration time."""

    def count(self, results: list[ProfilingResult], iteration_time_s: float) -> None:
        """A measured round: its joules and iterations (every GPU)."""
        self.round_iterations = max((len(r.iter_time) for r in results), default=0)
        self.energy_j += math.fsum(math.fsum(r.iter_energy) for r in results)
        self.iterations += self.round_iterations
        self.last_iteration_s = iteration_time_s

    def totals(self) -> str:
        return f"{self.energy_j:,.0f} J in {self.iterations} iteration(s), all GPUs"

    def add_sweep_round(self, figures: RoundFigures, baseline: Sequence[RoundFigures]) -> None:
        """A sweep round's cost against the median all-max round."""
        if not baseline:
            return
        t0, e0 = median_figures(baseline)
        n = max(1, self.round_iterations)
        self.cost_s += (figures.iteration_time_s - t0) * n
        self.cost_j += (figures.energy_j - e0) * n

    def rounds_left(self, round_: int, sweep: InstructionSweep | None) -> int:
        """About how many profiling rounds are still to come after `round_`."""
        left = max(0, self.lead_in - round_ - 1)
        if sweep is not None and not sweep.done:
            left += sweep.rounds_left_estimate()
        return left

    def note(self, round_: int, sweep: InstructionSweep | None, *, baseline_round: bool) -> str:
        """The line for the job's log after profiling round `round_`."""
        done = round_ + 1
        what = "all-max baseline" if baseline_round else "clock sweep"
        return (
            f"profiling round {done} of about {done + self.rounds_left(round_, sweep)} "
            f"({what}); the sweep has cost {self.cost_s:+.2f} s and {self.cost_j:+.0f} J "
            "against all-max so far"
        )

    def measured_round_steps(self, refresh_s: list[float | None]) -> int | None:
        """Iterations a round measured against another (all-max baseline and reference
        rounds, the deployed plan's) needs to hold `round_ticks` refreshes of the slowest
        counter at the last measured iteration time (`counter_round_steps`; None: the
        ranks' own rounds)."""
        if not self.windows:
            return None
        return counter_round_steps(refresh_s, self.last_iteration_s, self.round_ticks)
