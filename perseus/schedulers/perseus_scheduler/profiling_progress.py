"""How far `Perseus`'s profiling is, what it cost, and what the job measured so far.

`ProfilingProgress` counts the job's measured joules and iterations (every GPU), the
sweep's cost against the all-max rounds measured beside it, the rounds still to come (for
progress notes and `RoundStatus.profiling_rounds`), and sizes the rounds measured against
one another to hold enough refreshes of the GPUs' energy counters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from perseus.domain.profile import InstructionProfile
from perseus.domain.rows import ProfileRow
from perseus.errors import PlanError
from perseus.protocol import ProfilingResult, RankInfo
from perseus.schedulers.measurement import RoundMeasurement
from perseus.schedulers.perseus_scheduler.checks import short_instructions
from perseus.schedulers.perseus_scheduler.guard import RoundFigures, median_figures
from perseus.schedulers.sweep.levels import counter_round_steps

__all__ = ["ProfilingProgress", "RoundsLeft"]


class RoundsLeft(Protocol):
    """A sweep whose rounds profiling runs (`InstructionSweep`, or the per-stage one of
    `perseus.schedulers.perseus_scheduler.stage_clocks`), as far as progress reports need it."""

    @property
    def done(self) -> bool: ...

    def rounds_left_estimate(self) -> int: ...


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
        self.all_max_round: RoundMeasurement | None = None
        """The last all-max profiling round (its instruction times per stage and kind)."""

    def restart(self, lead_in: int) -> None:
        """The job is profiled again (`Perseus._reprofile`): all-max rounds until round
        `lead_in`, then a new sweep; the job's totals go on."""
        self.lead_in = lead_in
        self.sweep_rounds = []
        self.all_max_round = None

    def count(self, results: list[ProfilingResult], iteration_time_s: float) -> None:
        """A measured round: its joules and iterations (every GPU)."""
        self.round_iterations = max((len(r.iter_time) for r in results), default=0)
        self.energy_j += math.fsum(math.fsum(r.iter_energy) for r in results)
        self.iterations += self.round_iterations
        self.last_iteration_s = iteration_time_s

    def saw_all_max(self, m: RoundMeasurement) -> None:
        """An all-max profiling round (not the warm-up)."""
        self.all_max_round = m

    def too_short(self, switch_latency_s: float) -> bool:
        """Whether the all-max rounds already showed instructions too short to plan clocks
        for (`perseus.schedulers.perseus_scheduler.checks.short_instructions`)."""
        m = self.all_max_round
        if m is None:
            return False
        times = [t for stage in m.virtual_stages for t in stage.time_s.values()]
        return short_instructions(times, switch_latency_s=switch_latency_s) is not None

    def max_clock_profile(
        self, job_id: str, max_freq_mhz: int, rank_infos: Sequence[RankInfo]
    ) -> InstructionProfile:
        """The profile the last all-max round gives: every (stage, kind) at the max clock
        only (emulated when a rank is)."""
        m = self.all_max_round
        if m is None:
            raise PlanError(f"Job {job_id}: no all-max round measured yet")
        rows = [
            ProfileRow(
                rank=vs.rank,
                dp_rank=0,
                pp_rank=vs.rank,
                tp_rank=0,
                stage=stage,
                instruction=kind,
                frequency=max_freq_mhz,
                time=vs.time_s[kind],
                energy=vs.energy_j.get(kind, 0.0),
                emulated=any(r.emulated for r in rank_infos),
            )
            for stage, vs in enumerate(m.virtual_stages)
            for kind in vs.time_s
        ]
        return InstructionProfile.from_rows(
            rows, source=f"job {job_id} (all-max rounds)", check_power=False
        )

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

    def rounds_left(self, round_: int, sweep: RoundsLeft | None) -> int:
        """About how many profiling rounds are still to come after `round_`."""
        left = max(0, self.lead_in - round_ - 1)
        if sweep is not None and not sweep.done:
            left += sweep.rounds_left_estimate()
        return left

    def note(
        self,
        round_: int,
        sweep: RoundsLeft | None,
        *,
        baseline_round: bool,
        what: str | None = None,
    ) -> str:
        """The line for the job's log after profiling round `round_` (`what`: the kind of
        round, when not the all-max baseline or the clock sweep)."""
        done = round_ + 1
        what = what or ("all-max baseline" if baseline_round else "clock sweep")
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
