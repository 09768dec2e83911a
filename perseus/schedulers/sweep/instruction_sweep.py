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
the noise of a power-capped plateau (energies a few percent apart in any order) does not
stop it at the top, as it stops the ``full`` sweep on the real Bloom A40 profile. REFINE
(``refine``, on by default) then measures only the skipped levels that could shape an
instruction's time–energy hull (`perseus.schedulers.sweep.followup`). Grouped sweeps (the Zeus
baselines measure a whole round at one clock) use ``full``. Figures:
``benchmarks/bench_profiling_cost.py``.

Energies come from what a GPU shows (``estimator="windows"``, the default): see
`perseus.schedulers.sweep.option_estimates`; options whose energy stays uncertain are measured again in

```
... ──▶ CONFIRM (options whose uncertainty could change the plan, measured again) ──▶ DONE
```
"""

from __future__ import annotations

import enum
import logging
import math
import statistics
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

from perseus.domain.kinds import INSTRUCTIONS
from perseus.domain.profile import InstructionProfile
from perseus.domain.rows import ProfileRow
from perseus.errors import ConfigurationError, RankError
from perseus.io.profile_csv import write_profile_rows
from perseus.schedulers.args import SweepArgs
from perseus.schedulers.measurement import RoundMeasurement, StagePlan, measured_unit_time
from perseus.schedulers.pipeline import PipelineScheduler
from perseus.schedulers.sweep.followup import FollowUp
from perseus.schedulers.sweep.levels import (
    coarse_levels,
    sweep_round_steps,
)
from perseus.schedulers.sweep.option_estimates import SweepEstimates
from perseus.schedulers.sweep.power_fit import PowerRegression
from perseus.schedulers.sweep.products import ProfilingCost, profile_rows, profiling_report
from perseus.schedulers.sweep.row_times import note_landing, untrusted_times

__all__ = ["InstructionSweep", "SweepPhase"]

logger = logging.getLogger(__name__)

Metric = Callable[[Hashable, RoundMeasurement], float]


class SweepPhase(enum.Enum):
    """WARMUP → SWEEP → DONE (see the module docstring)."""

    WARMUP = "warmup"
    SWEEP = "sweep"
    REFINE = "refine"
    CONFIRM = "confirm"
    DONE = "done"


def _default_group(stage: int, instruction: str) -> Hashable:
    return (stage, instruction)


def _default_metric(group: Hashable, m: RoundMeasurement) -> float:
    stage, instruction = group  # type: ignore[misc]
    return m.virtual_stages[stage].energy_j[instruction]


class InstructionSweep:
    """Sweeps SM frequencies high → low over rounds and records every instruction's numbers.

    Args:
        scheduler: The pipeline scheduler whose job is profiled.
        args: The sweep's arguments (`perseus.schedulers.args.SweepArgs`: warm-up rounds, frequency
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
        self.landing_only: set[tuple[int, str, int]] = set()
        """(stage, kind, MHz) whose time in `time_s` holds no instruction that ran clear
        of a clock change (`perseus.schedulers.sweep.row_times`)."""
        self.left_out: list[dict[str, Any]] = []
        """The rows `rows` left out (below the max clock) or could not trust (at it), each
        with its reason: the estimates' (a power no GPU draws) and the times'."""
        self.measurements: dict[int, RoundMeasurement] = {}
        """Sweep frequency → the measurement of the step that ran it."""
        self.p2p_samples: list[float] = []
        self._missing = 0
        self._warmup_seen = 0
        self.estimates = SweepEstimates(scheduler, args)
        """Every option's energy: fitted to the energy counter's windows, or the breakdown."""
        self.round_ticks = args.round_ticks
        self.follow_up = FollowUp(
            args,
            self.levels,
            self.units,
            self.estimates,
            scheduler.job_info.job_id,
            landing_only=self.landing_only,
        )
        """REFINE and CONFIRM: the levels still to measure after the pass."""
        self.cost = ProfilingCost()
        self.last_iteration_s: float | None = None

    @property
    def windows(self) -> bool:
        """Energies are fitted to the ranks' energy windows (`perseus.schedulers.sweep.option_estimates`)."""
        return self.estimates.windows

    @property
    def regression(self) -> PowerRegression:
        return self.estimates.regression

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
                return self.follow_up.rounds_left()
        left = self.warmup_left if self.phase is SweepPhase.WARMUP else 0
        left += max(0, len(self.pass_levels) - self.step)
        if self.coarse and self.refine:
            step = max(1, len(self.levels) // max(1, len(self.pass_levels)))
            left += 2 * max(1, math.ceil(math.log2(step + 1)))
        return left

    def _freq_of(self, stage: int, name: str) -> int:
        if self.phase is SweepPhase.SWEEP and self._group(stage, name) in self.active:
            return self.pass_levels[self.step]
        level = None
        if self.phase is SweepPhase.CONFIRM:
            level = self.follow_up.confirm_level(stage)
        elif self.phase is SweepPhase.REFINE:
            level = self.follow_up.refine_level(stage, name)
        return self.levels[0] if level is None else level

    def round_steps(self) -> int | None:
        """Iterations the next round needs to hold `round_ticks` refreshes of the slowest
        energy counter (`sweep_round_steps`; None: the ranks' own rounds, also without
        windows and once done)."""
        if not self.windows or self.done:
            return None
        refresh = [r.energy_refresh_s for r in self.scheduler.rank_infos]
        return sweep_round_steps(refresh, self.last_iteration_s, self.round_ticks)

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
        self.estimates.absorb(m)

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
            case SweepPhase.REFINE:
                self._missing = 0
                if self.follow_up.record_refine(m, self.time_s, self.energy_j):
                    self._confirm()
            case SweepPhase.CONFIRM:
                self._missing = 0
                if self.follow_up.record_confirm(m, self.time_s, self.energy_j):
                    self._confirm()

    def _record(self, m: RoundMeasurement) -> None:
        freq = self.pass_levels[self.step]
        self.measurements[freq] = m
        if self.step == 0 and m.p2p_power_w is not None:
            self.p2p_samples.append(m.p2p_power_w)
        for g in list(self.active):
            for stage, name in self.groups[g]:
                vs = m.virtual_stages[stage]
                t, own = measured_unit_time(m, stage, name, freq, vs.time_s[name])
                self.time_s.setdefault((stage, name), {})[freq] = t
                note_landing(self.landing_only, (stage, name, freq), own)
                self.energy_j.setdefault((stage, name), {})[freq] = self.estimates.energy(
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
            if (
                self.coarse
                and self.refine
                and self.follow_up.start_refine(self.time_s, self.energy_j)
            ):
                self.phase = SweepPhase.REFINE
                logger.info(
                    "Job %s: coarse pass done after %d round(s); refining %d instruction(s)",
                    self.scheduler.job_info.job_id,
                    self.step,
                    len(self.follow_up.pending),
                )
            else:
                self._confirm()

    def _confirm(self) -> None:
        """After the passes: CONFIRM the options whose uncertainty could change the plan,
        if any (`FollowUp.start_confirm`), else DONE."""
        confirm = self.follow_up.start_confirm(self.time_s, self.energy_j, self.cost.rounds)
        self.phase = SweepPhase.CONFIRM if confirm else SweepPhase.DONE

    # ------------------------------------------------------------------ products
    def p2p_power_w(self) -> float | None:
        """The measured per-GPU power while not computing: fitted to the windows ('windows':
        the median over GPUs), else the median of the all-max rounds' breakdown residuals."""
        if self.windows:
            fitted = self.estimates.block_power_w()
            if fitted is not None:
                return max(fitted, 0.0)
        return statistics.median(self.p2p_samples) if self.p2p_samples else None

    def rows(self) -> list[ProfileRow]:
        """The profile's rows (`perseus.schedulers.sweep.products.profile_rows`), energies
        refitted; 'windows' rows say they are estimated, with their standard error, and
        leave out options whose energy they could not tell."""
        self.estimates.refit(self.energy_j, self.time_s)
        rows = self.estimates.annotate(
            profile_rows(self.scheduler, self.units, self.time_s, self.energy_j)
        )
        untrusted = untrusted_times(rows, self.landing_only)
        if untrusted:
            new = sorted(
                set(untrusted)
                - {(e["stage"], e["instruction"], e["frequency"]) for e in self.left_out}
            )
            if new:
                logger.warning(
                    "Job %s: %d profile row(s) whose time is not their clock's (left out of "
                    "the plan): %s",
                    self.scheduler.job_info.job_id,
                    len(untrusted),
                    "; ".join(
                        f"stage {s} {k} at {f} MHz: {untrusted[s, k, f]}" for s, k, f in new[:3]
                    )
                    + (f" and {len(new) - 3} more" if len(new) > 3 else ""),
                )
        self.left_out = [
            *self.estimates.left_out,
            *(
                {"stage": s, "instruction": k, "frequency": f, "reason": why, "max_clock": False}
                for (s, k, f), why in sorted(untrusted.items())
            ),
        ]
        return [r for r in rows if (r.stage, r.instruction, r.frequency) not in untrusted]

    def profile(self) -> InstructionProfile:
        """The sweep's numbers as the solver's `InstructionProfile`."""
        # In s and J by construction: no unit check; a bad max-clock row is for Perseus' checks.
        return InstructionProfile.from_rows(
            self.rows(), source=f"job {self.scheduler.job_info.job_id}", check_power=False
        )

    def report(
        self, plan_time_s: float | None = None, plan_energy_j: float | None = None
    ) -> dict[str, Any]:
        """What the profile cost and how sure it is (`profiling_report`)."""
        report = profiling_report(
            self.cost,
            self.estimates,
            self.energy_j,
            round_ticks=self.round_ticks,
            confirmed_options=len(self.follow_up.repeats),
            plan_time_s=plan_time_s,
            plan_energy_j=plan_energy_j,
        )
        if self.left_out:  # the estimates' rows and the times' (`rows`)
            report["left_out"] = self.left_out
        return report

    def write_csv(self, path: Path) -> Path:
        """Write the profile CSV (long form), creating the folder."""
        path.parent.mkdir(parents=True, exist_ok=True)
        write_profile_rows(path, self.rows())
        logger.info(
            "Job %s: instruction profile written to %s", self.scheduler.job_info.job_id, path
        )
        return path
