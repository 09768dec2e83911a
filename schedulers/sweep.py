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
"""

from __future__ import annotations

import enum
import logging
import math
import statistics
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path

from perseus.domain.kinds import INSTRUCTIONS
from perseus.domain.profile import InstructionProfile
from perseus.errors import ConfigurationError, RankError
from perseus.protocol import InstructionProfilingResult, OfflineProfilingResult
from schedulers.args import SweepArgs
from schedulers.pipeline import PipelineScheduler, RoundMeasurement, StagePlan

__all__ = ["InstructionSweep", "SweepPhase", "coarse_levels", "refine_levels"]

logger = logging.getLogger(__name__)

Metric = Callable[[Hashable, RoundMeasurement], float]


class SweepPhase(enum.Enum):
    """WARMUP → SWEEP → DONE (see the module docstring)."""

    WARMUP = "warmup"
    SWEEP = "sweep"
    REFINE = "refine"
    DONE = "done"


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
        if self.phase is SweepPhase.REFINE and self.pending.get((stage, name)):
            return self.pending[stage, name][0]
        return self.levels[0]

    def current_plan(self) -> StagePlan:
        """The plan of the round being issued (all max during warm-up and once done): per
        pipeline rank, each instruction at its (stage, kind)'s frequency."""
        return [
            [(i.kind, self._freq_of(i.stage, i.kind)) for i in order]
            for order in self.scheduler.pipeline.orders
        ]

    def observe(self, m: RoundMeasurement | None) -> None:
        """Record the last issued round and advance the state machine."""
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
            case SweepPhase.REFINE:
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
                self.time_s.setdefault((stage, name), {})[freq] = vs.time_s[name]
                self.energy_j.setdefault((stage, name), {})[freq] = vs.energy_j[name]
            value = self._metric(g, m)
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
        for unit, left in list(self.pending.items()):
            stage, name = unit
            freq = left.pop(0)
            vs = m.virtual_stages[stage]
            self.time_s[unit][freq] = vs.time_s[name]
            self.energy_j[unit][freq] = vs.energy_j[name]
            if not left:
                more = self._refine_next(unit)
                if more:
                    self.pending[unit] = more
                else:
                    del self.pending[unit]
        if not self.pending:
            self.phase = SweepPhase.DONE

    def _refine_next(self, unit: tuple[int, str]) -> list[int]:
        energy = self.energy_j.get(unit, {})
        points = {f: (t, energy[f]) for f, t in self.time_s.get(unit, {}).items()}
        return refine_levels(points, self.levels, self.refine_tolerance)

    # ------------------------------------------------------------------ products
    def p2p_power_w(self) -> float | None:
        """The measured per-GPU power while not computing (median of the all-max rounds)."""
        return statistics.median(self.p2p_samples) if self.p2p_samples else None

    def result(self) -> InstructionProfilingResult:
        """The profile: one entry per pipeline (virtual) stage, with every kind the stage
        runs (rank = the first rank of the pipeline rank that holds it)."""
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

    def profile(self) -> InstructionProfile:
        """The sweep's numbers as the solver's `InstructionProfile`."""
        return InstructionProfile.from_rows(
            self.result().rows(), source=f"job {self.scheduler.job_info.job_id}"
        )

    def write_csv(self, path: Path) -> Path:
        """Write the profile CSV (long form), creating the folder."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.result().to_csv(path)
        logger.info(
            "Job %s: instruction profile written to %s", self.scheduler.job_info.job_id, path
        )
        return path
