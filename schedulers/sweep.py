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
"""

from __future__ import annotations

import enum
import logging
import statistics
from collections.abc import Callable, Hashable
from pathlib import Path

from perseus.domain.kinds import INSTRUCTIONS
from perseus.domain.profile import InstructionProfile
from perseus.errors import ConfigurationError, RankError
from perseus.protocol import InstructionProfilingResult, OfflineProfilingResult
from schedulers.args import SweepArgs
from schedulers.pipeline import PipelineScheduler, RoundMeasurement, StagePlan

__all__ = ["InstructionSweep", "SweepPhase"]

logger = logging.getLogger(__name__)

Metric = Callable[[Hashable, RoundMeasurement], float]


class SweepPhase(enum.Enum):
    """WARMUP → SWEEP → DONE (see the module docstring)."""

    WARMUP = "warmup"
    SWEEP = "sweep"
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
        """Frequencies profiled, descending; levels[0] is the maximum."""
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

    def _freq_of(self, stage: int, name: str) -> int:
        if self.phase is SweepPhase.SWEEP and self._group(stage, name) in self.active:
            return self.levels[self.step]
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

    def _record(self, m: RoundMeasurement) -> None:
        freq = self.levels[self.step]
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
            self._rises[g] = self._rises[g] + 1 if hist and value > hist[-1][1] else 0
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
        if self.step >= len(self.levels) or not self.active:
            self.active.clear()
            self.phase = SweepPhase.DONE

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
            entry[f"{name}_time"] = dict(self.time_s.get((stage, name), {}))
            entry[f"{name}_energy"] = dict(self.energy_j.get((stage, name), {}))
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
