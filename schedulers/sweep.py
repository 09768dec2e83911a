"""The online instruction profiler: a frequency sweep over scheduling rounds.

`InstructionSweep` is the state machine the profiling schedulers (`InstructionProfiler`,
`Perseus`, `EnvPipe`, `ZeusGlobal`, `ZeusPerStage`) share:

```
WARMUP ──(warmup_rounds rounds at max frequency, results ignored)──▶ SWEEP
SWEEP  ──(step k: every active instruction at levels[k], high → low)──▶ SWEEP | DONE
DONE   (terminal: the profile is complete)
```

The swept unit is one (pipeline stage, instruction kind) the schedule runs, where the stage
is the pipeline's *virtual* stage (a rank holding several stages, as in interleaved or ZBV
schedules, is profiled per stage) and the kinds include the split backward's I and W.
Instructions are grouped for early stopping (default: one group per (stage, instruction)):
a group stops after `early_stop_after` consecutive rounds in which its metric (default: the
instruction's energy) rose, or when the levels run out. An instruction whose group stopped
runs at the **maximum** frequency for the rest of the sweep: it keeps the profiling rounds
as fast as possible and never touches frequencies already shown to waste energy. A round
in which some rank did not report is repeated (same step); `max_missing_rounds`
incomplete rounds in a row are an error naming the silent ranks.

The ``coarse`` sweep (`SweepArgs.sweep`, the default) cuts the rounds a profile costs:

```
WARMUP ──▶ SWEEP (every coarse_step-th clock, high → low) ──▶ REFINE ──▶ DONE
```

Its SWEEP measures every ``coarse_step``-th supported clock (every level when ``freq_step``
is that coarse already) and stops an instruction once its energy has been more than
``stop_margin`` above its minimum so far for ``early_stop_after`` levels in a row: past its
energy-optimal clock, measured against the minimum rather than the previous level, so that
the noise of a power-capped plateau
(energies a few percent apart in any order) does not stop it at the top, as it stops the
``full`` sweep on the real Bloom A40 profile. REFINE (``refine``, on by default) then
measures, per instruction, only skipped levels next to the points that shape its
time–energy hull, by bisection (`refine_levels`): around the fastest and the cheapest
option, and around vertices where the hull bends enough that a skipped level could lie
more than ``refine_tolerance`` below the line between its measured neighbours. Where the
hull is straight, skipped levels would give the solver nothing new. Each REFINE round
runs every instruction at its own next level (the others at max), so REFINE takes as
many rounds as the instruction with the most levels to measure. Grouped sweeps (the Zeus
baselines measure a whole round at one clock) use ``full``. Figures:
``benchmarks/bench_profiling_cost.py``.

**Energies come from what a GPU shows** (``estimator="windows"``, the default, when every
rank measured its energy counter's refresh period): no GPU shows an instruction's own
energy, so each round's energy windows (the energy between two refreshes of the counter,
and the seconds each instruction ran inside) go into a least-squares fit per GPU
(`schedulers.estimation`) that gives every (stage, kind, clock) its energy and a standard
error, and the blocking power its value. Rounds are sized to hold ``round_ticks``
refreshes (`round_steps`, from the measured refresh period and iteration time), and after
the sweep

```
... ──▶ CONFIRM (options whose uncertainty could change the plan, measured again) ──▶ DONE
```

measures again the options whose relative standard error is above ``target_uncertainty``
and that are not clearly dominated (at most ``max_repeats`` times each, and in at most
half as many rounds as came before). ``estimator="breakdown"`` takes each instruction's
reported energy as it is, as before (a real GPU's breakdown is its iteration's mean power
times the instruction's time): it remains for ranks that report no windows.
"""

from __future__ import annotations

import enum
import logging
import math
import statistics
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from perseus.domain.kinds import INSTRUCTIONS
from perseus.domain.profile import InstructionProfile
from perseus.domain.rows import ProfileRow
from perseus.errors import ConfigurationError, RankError
from perseus.io.profile_csv import write_profile_rows
from perseus.protocol import MAX_ITERATIONS, InstructionProfilingResult, OfflineProfilingResult
from schedulers.args import SweepArgs
from schedulers.estimation import PowerRegression
from schedulers.pipeline import PipelineScheduler, RoundMeasurement, StagePlan

__all__ = [
    "InstructionSweep",
    "ProfilingCost",
    "SweepPhase",
    "coarse_levels",
    "counter_round_steps",
    "refine_levels",
]

logger = logging.getLogger(__name__)

Metric = Callable[[Hashable, RoundMeasurement], float]


class SweepPhase(enum.Enum):
    """WARMUP → SWEEP → DONE (see the module docstring)."""

    WARMUP = "warmup"
    SWEEP = "sweep"
    REFINE = "refine"
    CONFIRM = "confirm"
    DONE = "done"


MIN_ROUND_S = 0.5
"""The shortest sweep round on a continuous counter (ideal emulated sensors): its windows
are exact, but the fit needs a few of them per round."""


def counter_round_steps(
    refresh_s: Sequence[float | None], iteration_s: float | None, round_ticks: int
) -> int | None:
    """Iterations a round needs to hold `round_ticks` refreshes of the slowest of the
    ranks' energy counters (`RankInfo.energy_refresh_s`), at the last measured iteration
    time; None (the ranks' own rounds) when a counter's period is unknown, every counter is
    continuous, or no iteration was measured yet."""
    if iteration_s is None or not refresh_s or any(r is None for r in refresh_s):
        return None
    slowest = max(r for r in refresh_s if r is not None)
    if slowest <= 0:
        return None
    # Two more refreshes than asked: the partial periods at both ends are not windows.
    steps = math.ceil((round_ticks + 2) * slowest / max(iteration_s, 1e-6) - 1e-9)
    return max(1, min(steps, MAX_ITERATIONS))


@dataclass
class ProfilingCost:
    """What the profiling rounds cost: how many, their iterations, seconds and joules (all
    GPUs of the job, measured)."""

    rounds: int = 0
    iterations: int = 0
    seconds: float = 0.0
    energy_j: float = 0.0

    def add(self, m: RoundMeasurement) -> None:
        self.rounds += 1
        self.iterations += m.iterations
        self.seconds += m.iteration_time_s * m.iterations
        self.energy_j += m.job_energy_j * m.iterations


def _default_group(stage: int, instruction: str) -> Hashable:
    return (stage, instruction)


def _default_metric(group: Hashable, m: RoundMeasurement) -> float:
    stage, instruction = group  # type: ignore[misc]
    return m.virtual_stages[stage].energy_j[instruction]


def coarse_levels(levels: Sequence[int], step: int) -> list[int]:
    """Every `step`-th of `levels` (descending) from the top. The few below the last one are
    left to REFINE, which bisects them only if the instruction is cheapest there."""
    return list(levels[::step])


def _lower_hull(points: list[tuple[float, float, int]]) -> list[tuple[float, float, int]]:
    """The Pareto set's lower convex hull: (time, energy, freq), fastest first."""
    pareto: list[tuple[float, float, int]] = []
    for p in sorted(points):
        if not pareto or p[1] < pareto[-1][1]:
            pareto.append(p)
    hull: list[tuple[float, float, int]] = []
    for p in pareto:
        while len(hull) >= 2:
            (t0, e0, _), (t1, e1, _) = hull[-2], hull[-1]
            if (t1 - t0) * (p[1] - e0) - (e1 - e0) * (p[0] - t0) > 0:
                break
            hull.pop()
        hull.append(p)
    return hull


def refine_levels(
    measured: Mapping[int, tuple[float, float]], levels: Sequence[int], tolerance: float
) -> list[int]:
    """The next levels worth measuring for one instruction, descending ([]: done).

    `measured`: frequency → (time s, energy J) so far; `levels`: every level the sweep may
    run. The solver plans with an instruction's Pareto options; along a straight stretch of
    their lower convex hull a skipped level can only add a point near the line, so skipped
    levels are measured only next to the hull vertices that matter, by bisection: the
    middle skipped level between such a vertex and each of its measured neighbours (in
    frequency). The vertices: the fastest (the critical path runs it) and the cheapest
    (slack is filled down to it), until their neighbours are adjacent levels, and every
    other vertex whose energy lies more than ``4·tolerance`` (relative) below the chord of
    its hull neighbours: a curve bending that much over two gaps may lie about
    `tolerance` below the chord inside each gap (a parabola's sag over one gap is a quarter
    of its sag over two). Call again with the new points until it returns [].
    """
    if len(measured) < 2:
        return []
    hull = _lower_hull([(t, e, f) for f, (t, e) in measured.items()])
    chosen = {hull[0][2], hull[-1][2]}
    for (t0, e0, _), (t, e, f), (t1, e1, _) in zip(hull, hull[1:], hull[2:], strict=False):
        chord = e0 + (e1 - e0) * (t - t0) / (t1 - t0)
        if chord - e > 4.0 * tolerance * e:
            chosen.add(f)
    freqs = sorted(measured, reverse=True)
    out: set[int] = set()
    cheapest = hull[-1][2]
    for f in chosen:
        k = freqs.index(f)
        higher = freqs[k - 1] if k > 0 else f
        # Below the lowest point measured only when it is the cheapest: the coarse pass
        # ended there without seeing the energy rise.
        lower = freqs[k + 1] if k + 1 < len(freqs) else (0 if f == cheapest else f)
        for lo, hi in ((f, higher), (lower, f)):
            skipped = [lv for lv in levels if lo < lv < hi]
            if skipped:
                out.add(skipped[len(skipped) // 2])
    return sorted(out, reverse=True)


class InstructionSweep:
    """Sweeps SM frequencies high → low over rounds and records every instruction's numbers.

    Args:
        scheduler: The pipeline scheduler whose job is profiled.
        args: The sweep's arguments (`schedulers.args.SweepArgs`: warm-up rounds, frequency
            step, lowest frequency, early stop), validated already.
        group: (pipeline stage, instruction) → early-stop group (the stage is the virtual
            stage; `scheduler.pipeline.stage_ranks` maps it to its pipeline rank).
        metric: (group, measurement) → the value whose rises stop the group.
        max_missing_rounds: Incomplete rounds in a row tolerated before giving up.
    """

    def __init__(
        self,
        scheduler: PipelineScheduler,
        args: SweepArgs,
        *,
        group: Callable[[int, str], Hashable] = _default_group,
        metric: Metric = _default_metric,
        max_missing_rounds: int = 3,
    ) -> None:
        freqs = scheduler.frequencies
        min_frequency = args.min_frequency
        if min_frequency is not None and min_frequency > freqs[0]:
            raise ConfigurationError(
                f"min_frequency {min_frequency} MHz is above the GPUs' maximum {freqs[0]} MHz; "
                f"choose a value in {freqs[-1]}..{freqs[0]}"
            )
        floor = freqs[-1] if min_frequency is None else min_frequency
        self.levels: list[int] = [f for f in freqs[:: args.freq_step] if f >= floor]
        """Frequencies that may be profiled, descending; levels[0] is the maximum."""
        self.coarse = args.sweep == "coarse"
        if self.coarse and (group is not _default_group or metric is not _default_metric):
            raise ConfigurationError(
                "The coarse sweep measures each instruction on its own; a grouped sweep "
                "(one clock per round for a whole group) needs sweep='full'"
            )
        # coarse_step counts the GPU's clocks: with freq_step ≥ coarse_step the levels are
        # coarse already and the pass takes them all.
        step = max(1, round(args.coarse_step / args.freq_step))
        self.pass_levels: list[int] = (
            coarse_levels(self.levels, step) if self.coarse else self.levels
        )
        """The SWEEP phase's levels, one per round (every level for ``full``)."""
        self.stop_margin = args.stop_margin
        self.refine = args.refine
        self.refine_tolerance = args.refine_tolerance
        self.pending: dict[tuple[int, str], list[int]] = {}
        """REFINE: per (stage, kind), the levels still to measure, descending."""
        self.scheduler = scheduler
        self.phase = SweepPhase.WARMUP if args.warmup_rounds else SweepPhase.SWEEP
        self.warmup_left = args.warmup_rounds
        self.step = 0
        self.early_stop_after = args.early_stop_after
        self.max_missing_rounds = max_missing_rounds
        self._group = group
        self._metric = metric
        used = {(i.stage, i.kind) for order in scheduler.pipeline.orders for i in order}
        self.units: list[tuple[int, str]] = sorted(
            used, key=lambda u: (u[0], INSTRUCTIONS.index(u[1]))
        )
        """Every (pipeline stage, kind) the schedule runs, by stage then kind."""
        self.groups: dict[Hashable, list[tuple[int, str]]] = {}
        for stage, name in self.units:
            self.groups.setdefault(group(stage, name), []).append((stage, name))
        self.active: set[Hashable] = set(self.groups)
        self.history: dict[Hashable, list[tuple[int, float]]] = {g: [] for g in self.groups}
        """Group → [(freq_mhz, metric)] in sweep order."""
        self._rises: dict[Hashable, int] = dict.fromkeys(self.groups, 0)
        self.time_s: dict[tuple[int, str], dict[int, float]] = {}
        self.energy_j: dict[tuple[int, str], dict[int, float]] = {}
        self.measurements: dict[int, RoundMeasurement] = {}
        """Sweep frequency → the measurement of the step that ran it."""
        self.p2p_samples: list[float] = []
        self._missing = 0
        self._warmup_seen = 0
        refresh = [r.energy_refresh_s for r in scheduler.rank_infos]
        self.windows = args.estimator == "windows" and all(r is not None for r in refresh)
        """Energies are fitted to the ranks' energy windows (`schedulers.estimation`)."""
        self.refresh_s = max((r for r in refresh if r is not None), default=0.0)
        """The slowest energy counter's refresh period (0: continuous)."""
        self.round_ticks = args.round_ticks
        self.target_uncertainty = args.target_uncertainty
        self.max_repeats = args.max_repeats
        self.regression = PowerRegression()
        self.energy_se: dict[tuple[int, str], dict[int, float]] = {}
        """'windows': each option's standard error, J."""
        self.repeats: dict[tuple[int, str, int], int] = {}
        self.confirm_rounds_left = 0
        self.cost = ProfilingCost()
        self.last_iteration_s: float | None = None
        if args.estimator == "windows" and not self.windows:
            logger.warning(
                "Job %s: rank(s) %s did not measure an energy counter's refresh period (no "
                "counter, or an older client): each instruction's energy is taken as the "
                "ranks report it",
                scheduler.job_info.job_id,
                [r.rank for r in scheduler.rank_infos if r.energy_refresh_s is None],
            )

    @property
    def done(self) -> bool:
        return self.phase is SweepPhase.DONE

    def rounds_left_estimate(self) -> int:
        """About how many rounds the sweep still takes (for progress reports): the coarse
        levels left, then about two bisections per refined instruction's gap."""
        match self.phase:
            case SweepPhase.DONE:
                return 0
            case SweepPhase.REFINE:
                return max((len(v) for v in self.pending.values()), default=0) + 1
        left = self.warmup_left if self.phase is SweepPhase.WARMUP else 0
        left += max(0, len(self.pass_levels) - self.step)
        if self.coarse and self.refine:
            step = max(1, len(self.levels) // max(1, len(self.pass_levels)))
            left += 2 * max(1, math.ceil(math.log2(step + 1)))
        return left

    def _freq_of(self, stage: int, name: str) -> int:
        if self.phase is SweepPhase.SWEEP and self._group(stage, name) in self.active:
            return self.pass_levels[self.step]
        if self.phase is SweepPhase.CONFIRM:
            level = self._confirm_level(stage)
            return self.levels[0] if level is None else level
        if self.phase is SweepPhase.REFINE and self.pending.get((stage, name)):
            return self.pending[stage, name][0]
        return self.levels[0]

    def _confirm_level(self, stage: int) -> int | None:
        """CONFIRM: the clock every kind of `stage` runs this round, the highest of its
        kinds' next pending ones (one clock a stage: no clock changes within the round,
        which would charge an instruction part of its predecessor's clock)."""
        firsts = [left[0] for (s, _), left in self.pending.items() if s == stage and left]
        return max(firsts) if firsts else None

    def round_steps(self) -> int | None:
        """Iterations the next round needs to hold `round_ticks` refreshes of the slowest
        energy counter (`counter_round_steps`; None: the ranks' own rounds, also without
        windows and once done)."""
        if not self.windows or self.done:
            return None
        refresh = [r.energy_refresh_s for r in self.scheduler.rank_infos]
        if self.refresh_s == 0 and self.last_iteration_s is not None:
            # A continuous counter: any round has exact windows, but the fit needs a few.
            return max(
                1, min(math.ceil(MIN_ROUND_S / max(self.last_iteration_s, 1e-6)), MAX_ITERATIONS)
            )
        return counter_round_steps(refresh, self.last_iteration_s, self.round_ticks)

    def current_plan(self) -> StagePlan:
        """The plan of the round being issued (all max during warm-up and once done): per
        pipeline rank, each instruction at its (stage, kind)'s frequency."""
        return [
            [(i.kind, self._freq_of(i.stage, i.kind)) for i in order]
            for order in self.scheduler.pipeline.orders
        ]

    def absorb(self, m: RoundMeasurement) -> None:
        """Take a round's energy windows and instruction times into the fit, and its cost,
        without advancing the sweep: the sweep's own rounds, and any other round run while
        profiling (a scheduler's all-max baseline rounds are data too)."""
        self.cost.add(m)
        self.last_iteration_s = m.iteration_time_s
        if self.windows:
            for rank, rows in m.windows.items():
                self.regression.add(rank, rows)
            for rank, times in m.unit_time.items():
                for unit, (total_s, count) in times.items():
                    self.regression.add_time(rank, unit, total_s, count)

    def observe(self, m: RoundMeasurement | None) -> None:
        """Record the last issued round and advance the state machine."""
        if m is not None and self.phase is not SweepPhase.DONE:
            self.absorb(m)
        match self.phase:
            case SweepPhase.DONE:
                return
            case _ if m is None:
                self._missing += 1
                if self._missing >= self.max_missing_rounds:
                    raise RankError(
                        f"Job {self.scheduler.job_info.job_id}: {self._missing} profiling rounds "
                        "in a row without a result from every rank; each rank must POST its "
                        "ProfilingResult before asking for the next schedule"
                    )
                return
            case SweepPhase.WARMUP:
                self._missing = 0
                self._warmup_seen += 1
                if self._warmup_seen > 1 and m.p2p_power_w is not None:
                    self.p2p_samples.append(m.p2p_power_w)
                self.warmup_left -= 1
                if self.warmup_left <= 0:
                    self.phase = SweepPhase.SWEEP
            case SweepPhase.SWEEP:
                self._missing = 0
                self._record(m)
            case SweepPhase.REFINE | SweepPhase.CONFIRM:
                self._missing = 0
                self._record_refine(m)

    def _record(self, m: RoundMeasurement) -> None:
        freq = self.pass_levels[self.step]
        self.measurements[freq] = m
        if self.step == 0 and m.p2p_power_w is not None:
            self.p2p_samples.append(m.p2p_power_w)
        for g in list(self.active):
            for stage, name in self.groups[g]:
                vs = m.virtual_stages[stage]
                self.time_s.setdefault((stage, name), {})[freq] = _unit_time(
                    m, stage, name, freq, vs.time_s[name]
                )
                self.energy_j.setdefault((stage, name), {})[freq] = self._energy(
                    stage, name, freq, vs.energy_j[name]
                )
            value = (
                self.energy_j[self.groups[g][0]][freq]
                if self.windows and self._metric is _default_metric
                else self._metric(g, m)
            )
            hist = self.history[g]
            if self.coarse:
                # Past the optimum: above the minimum so far by more than the noise margin.
                best = min((v for _, v in hist), default=value)
                above = value > best * (1.0 + self.stop_margin)
            else:
                above = bool(hist) and value > hist[-1][1]
            self._rises[g] = self._rises[g] + 1 if above else 0
            hist.append((freq, value))
            if self._rises[g] >= self.early_stop_after:
                logger.info(
                    "Job %s: %s stops at %d MHz after %d rises",
                    self.scheduler.job_info.job_id,
                    g,
                    freq,
                    self._rises[g],
                )
                self.active.discard(g)
        self.step += 1
        if self.step >= len(self.pass_levels) or not self.active:
            self.active.clear()
            self.phase = SweepPhase.DONE
            if self.coarse and self.refine:
                self._start_refine()
            if self.phase is SweepPhase.DONE:
                self._start_confirm()

    def _start_refine(self) -> None:
        for unit in self.units:
            levels = self._refine_next(unit)
            if levels:
                self.pending[unit] = levels
        if self.pending:
            self.phase = SweepPhase.REFINE
            logger.info(
                "Job %s: coarse pass done after %d round(s); refining %d instruction(s)",
                self.scheduler.job_info.job_id,
                self.step,
                len(self.pending),
            )

    def _record_refine(self, m: RoundMeasurement) -> None:
        if self.phase is SweepPhase.CONFIRM:
            self._record_confirm(m)
            return
        for unit, left in list(self.pending.items()):
            stage, name = unit
            freq = left.pop(0)
            vs = m.virtual_stages[stage]
            self.time_s[unit][freq] = _unit_time(m, stage, name, freq, vs.time_s[name])
            self.energy_j[unit][freq] = self._energy(stage, name, freq, vs.energy_j[name])
            if not left:
                more = self._refine_next(unit)
                if more:
                    self.pending[unit] = more
                else:
                    del self.pending[unit]
        if not self.pending:
            self.phase = SweepPhase.DONE
            self._start_confirm()

    def _record_confirm(self, m: RoundMeasurement) -> None:
        """A CONFIRM round: every kind of a stage with options pending ran at its
        `_confirm_level`; each kind's time there is averaged over its rounds (and its
        energy refitted), and the level leaves the pending lists that held it."""
        levels = {stage: self._confirm_level(stage) for stage, _ in self.pending}
        for unit in self.units:
            stage, name = unit
            level = levels.get(stage)
            if level is None:
                continue
            vs = m.virtual_stages[stage]
            n = self.repeats.get((stage, name, level), 0)
            times = self.time_s.setdefault(unit, {})
            t = _unit_time(m, stage, name, level, vs.time_s[name])
            times[level] = (times.get(level, t) * n + t) / (n + 1)
            self.repeats[stage, name, level] = n + 1
            self.energy_j.setdefault(unit, {})[level] = self._energy(
                stage, name, level, vs.energy_j[name]
            )
            left = self.pending.get(unit)
            if left and left[0] == level:
                left.pop(0)
                if not left:
                    del self.pending[unit]
        self.confirm_rounds_left -= 1
        if self.confirm_rounds_left <= 0:
            self.pending.clear()
        if not self.pending:
            self.phase = SweepPhase.DONE
            self._start_confirm()

    # ------------------------------------------------------------------ estimates
    def _energy(self, stage: int, name: str, freq: int, breakdown_j: float) -> float:
        """The energy of one instruction of (stage, name) at `freq` as known now: fitted to
        the windows so far ('windows'), else the ranks' breakdown."""
        if not self.windows:
            return breakdown_j
        estimate = self._estimate(stage, name, freq)
        return breakdown_j if estimate is None else estimate[0]

    def _estimate(self, stage: int, name: str, freq: int) -> tuple[float, float] | None:
        """(energy J, standard error J) of (stage, name) at `freq`: the sum over the
        stage's tensor-parallel GPUs of the first data-parallel pipeline."""
        pp = self.scheduler.pipeline.stage_ranks[stage]
        members = self.scheduler.stage_ranks[pp]
        first_dp = min(r.dp_rank for r in members)
        total = var = 0.0
        for info in members:
            if info.dp_rank != first_dp:
                continue
            est = self.regression.unit_energy(info.rank, (stage, name, freq))
            if est is None:
                return None
            total += est[0]
            var += est[1] ** 2
        return total, math.sqrt(var)

    def _refit(self) -> None:
        """Every measured option's energy and standard error from the fit of all windows."""
        if not self.windows:
            return
        for unit, energies in self.energy_j.items():
            stage, name = unit
            se = self.energy_se.setdefault(unit, {})
            for freq in energies:
                estimate = self._estimate(stage, name, freq)
                if estimate is not None:
                    energies[freq], se[freq] = estimate
                else:
                    se[freq] = math.inf

    def _start_confirm(self) -> None:
        """'windows': measure again the options whose uncertainty could change the plan."""
        if not self.windows or self.target_uncertainty <= 0 or self.max_repeats <= 0:
            return
        if self.confirm_rounds_left <= 0 and not self.repeats:
            # At most half as many extra rounds as the profile took so far.
            self.confirm_rounds_left = max(1, self.cost.rounds // 2)
        if self.confirm_rounds_left <= 0:
            return
        self._refit()
        block_w = self.block_power_w() or 0.0
        for unit in self.units:
            freqs = self._uncertain(unit, block_w)
            if freqs:
                self.pending[unit] = freqs
        if self.pending:
            self.phase = SweepPhase.CONFIRM
            logger.info(
                "Job %s: measuring %d option(s) again whose energy is uncertain by more than "
                "%.1f %% and could change the plan",
                self.scheduler.job_info.job_id,
                sum(len(v) for v in self.pending.values()),
                100 * self.target_uncertainty,
            )

    def _uncertain(self, unit: tuple[int, str], block_w: float) -> list[int]:
        """`unit`'s options, descending, worth another measurement: relative standard error
        above the target, fewer than `max_repeats` repeats, and not clearly dominated (an
        option at least as fast costs less by more than both uncertainties) in the energy
        the plan counts (the instruction's, less the blocking power its time saves)."""
        stage, name = unit
        times, energies = self.time_s.get(unit, {}), self.energy_j.get(unit, {})
        ses = self.energy_se.get(unit, {})
        cost = {f: energies[f] - block_w * times[f] for f in energies}
        out = []
        for f in sorted(energies, reverse=True):
            se = ses.get(f, math.inf)
            if self.repeats.get((stage, name, f), 0) >= self.max_repeats:
                continue
            if se <= self.target_uncertainty * abs(energies[f]):
                continue
            dominated = any(
                times[g] <= times[f] and cost[g] + 2 * ses.get(g, math.inf) < cost[f] - 2 * se
                for g in energies
                if g != f
            )
            if not dominated:
                out.append(f)
        return out

    def block_power_w(self) -> float | None:
        """'windows': the median over GPUs of the fitted blocking power (None: no fit)."""
        fits = self.regression.fit()
        values = [f.block.power_w for f in fits.values() if math.isfinite(f.block.se_w)]
        return statistics.median(values) if values else None

    def _refine_next(self, unit: tuple[int, str]) -> list[int]:
        energy = self.energy_j.get(unit, {})
        points = {f: (t, energy[f]) for f, t in self.time_s.get(unit, {}).items()}
        return refine_levels(points, self.levels, self.refine_tolerance)

    # ------------------------------------------------------------------ products
    def p2p_power_w(self) -> float | None:
        """The measured per-GPU power while not computing: fitted to the windows ('windows':
        the median over GPUs), else the median of the all-max rounds' breakdown residuals."""
        if self.windows:
            fitted = self.block_power_w()
            if fitted is not None:
                return max(fitted, 0.0)
        return statistics.median(self.p2p_samples) if self.p2p_samples else None

    def result(self) -> InstructionProfilingResult:
        """The profile: one entry per pipeline (virtual) stage, with every kind the stage
        runs (rank = the first rank of the pipeline rank that holds it)."""
        self._refit()
        pipeline = self.scheduler.pipeline
        data: dict[int, dict[str, dict[int, float]]] = {}
        for stage, name in self.units:
            entry = data.setdefault(stage, {})
            # Descending frequency, whatever order the levels were measured in.
            entry[f"{name}_time"] = dict(sorted(self.time_s.get((stage, name), {}).items())[::-1])
            entry[f"{name}_energy"] = dict(
                sorted(self.energy_j.get((stage, name), {}).items())[::-1]
            )
        entries = []
        for stage, fields in sorted(data.items()):
            pp = pipeline.stage_ranks[stage]
            first = min(self.scheduler.stage_ranks[pp], key=lambda r: (r.dp_rank, r.tp_rank))
            entries.append(
                OfflineProfilingResult(
                    rank=first.rank,
                    dp_rank=first.dp_rank,
                    pp_rank=pp,
                    tp_rank=first.tp_rank,
                    stage=stage,
                    emulated=any(r.emulated for r in self.scheduler.stage_ranks[pp]),
                    **fields,
                )
            )
        return InstructionProfilingResult(entries)

    def rows(self) -> list[ProfileRow]:
        """The profile's rows; 'windows' rows say they are estimated, with their standard
        error."""
        rows = self.result().rows()
        if not self.windows:
            return rows
        top = {(r.stage, r.instruction): r.frequency for r in rows}
        for r in rows:
            top[r.stage, r.instruction] = max(top[r.stage, r.instruction], r.frequency)
        out = []
        for r in rows:
            if r.energy <= 0 and r.frequency < top[r.stage, r.instruction]:
                # The windows could not tell this option's energy apart (a fit at its bound):
                # the plan does without the clock rather than trust a zero.
                logger.info(
                    "Job %s: stage %d %s at %d MHz left out of the profile: its energy could "
                    "not be estimated from the counter's refreshes",
                    self.scheduler.job_info.job_id,
                    r.stage,
                    r.instruction,
                    r.frequency,
                )
                continue
            se = self.energy_se.get((r.stage, r.instruction), {}).get(r.frequency, math.inf)
            out.append(r._replace(estimated=True, energy_se=se))
        return out

    def profile(self) -> InstructionProfile:
        """The sweep's numbers as the solver's `InstructionProfile`."""
        # Measured in s and J by construction: no unit check. A zero or negative energy left
        # at the max clock is for the scheduler's checks to refuse, saying why.
        return InstructionProfile.from_rows(
            self.rows(), source=f"job {self.scheduler.job_info.job_id}", check_power=False
        )

    def report(self, plan_time_s: float | None = None, plan_energy_j: float | None = None) -> dict:
        """What the profile cost and how sure it is, for the log and ``profiling.json``.

        `plan_time_s`, `plan_energy_j`: the deployed plan's iteration (energy of all the
        job's GPUs): the profiling rounds' excess over running it instead ("off plan")."""
        cost = self.cost
        out: dict[str, object] = {
            "rounds": cost.rounds,
            "iterations": cost.iterations,
            "seconds": cost.seconds,
            "energy_j": cost.energy_j,
            "estimator": "windows" if self.windows else "breakdown",
            "refresh_s": self.refresh_s if self.windows else None,
            "round_ticks": self.round_ticks if self.windows else None,
            "confirmed_options": len(self.repeats),
        }
        if plan_time_s is not None and plan_energy_j is not None:
            out["off_plan_seconds"] = cost.seconds - plan_time_s * cost.iterations
            out["off_plan_energy_j"] = cost.energy_j - plan_energy_j * cost.iterations
        if self.windows:
            fits = self.regression.fit()
            blocks = [f.block for f in fits.values()]
            out["sampling"] = self.regression.model()
            out["windows"] = sum(f.windows for f in fits.values())
            out["blocking_power_w"] = self.block_power_w()
            out["blocking_power_se_w"] = (
                statistics.median(b.se_w for b in blocks) if blocks else None
            )
            rel = sorted(
                se / abs(self.energy_j[unit][f]) if self.energy_j[unit][f] else math.inf
                for unit, ses in self.energy_se.items()
                for f, se in ses.items()
            )
            out["options"] = len(rel)
            out["energy_se_median"] = statistics.median(rel) if rel else None
            out["energy_se_max"] = rel[-1] if rel else None
        return {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in out.items()
        }

    def write_csv(self, path: Path) -> Path:
        """Write the profile CSV (long form), creating the folder."""
        path.parent.mkdir(parents=True, exist_ok=True)
        write_profile_rows(path, self.rows())
        logger.info(
            "Job %s: instruction profile written to %s", self.scheduler.job_info.job_id, path
        )
        return path


def _unit_time(m: RoundMeasurement, stage: int, kind: str, freq: int, fallback_s: float) -> float:
    """The round's time of (stage, kind) at `freq`: the slowest rank's mean over the
    instructions that ran clear of a clock change (`RoundMeasurement.unit_time`; an
    instruction that starts while a change lands runs partly at the old clock), else
    `fallback_s`, the stage's mean over all its instructions."""
    means = [
        total / count
        for times in m.unit_time.values()
        if (acc := times.get((stage, kind, freq))) is not None
        for total, count in (acc,)
        if count > 0
    ]
    return max(means) if means else fallback_s
