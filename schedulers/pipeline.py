"""Pipeline-aware scheduler plumbing: 3D parallelism, round measurements, stage plans.

`PipelineScheduler` is the base of every shipped scheduler. Subclasses think in pipeline
stages; the 3D mapping is applied here, automatically whenever dp·tp > 1:

- results → one `StageMeasurement` per pipeline stage: an instruction's time is the
  **max** over all the stage's ranks (every tensor- and data-parallel copy: the slowest GPU
  sets the pace), its energy the **sum** over the stage's tensor-parallel ranks of the
  first data-parallel pipeline. Energies therefore describe *one* pipeline, the unit the
  profile, the solver and the plan accounting (`perseus.domain.plan`) use; all pipelines run the
  same plan, so summing over dp would only scale every option by dp.
- a `StagePlan` (per stage, the ``(instruction, freq_mhz)`` list of one iteration in
  execution order) → one `FrequencySchedule` per rank: every rank of a stage gets the
  stage's list. A scheduler may give individual data-parallel pipelines their own plan
  (`pipeline_overrides`, used for stragglers).

Round protocol: `next_schedule()` issues round k; `observe()` gets round k's results before
round k+1 is issued. A round that got no `observe()` (no rank reported) is handed to the
subclass as a missing measurement.
"""

from __future__ import annotations

import abc
import logging
import math
import statistics
from dataclasses import dataclass
from typing import ClassVar

from perseus.domain.plan import Plan
from perseus.domain.schedule import PipelineSchedule, make_schedule
from perseus.errors import ConfigurationError, PlanError, RankError
from perseus.io.jobdir import JobDir
from perseus.protocol import INSTRUCTIONS, FrequencySchedule, JobInfo, ProfilingResult, RankInfo
from perseus.settings import PerseusSettings
from schedulers.args import PipelineArgs, SchedulerArgs
from schedulers.base import FrequencyScheduler

__all__ = [
    "PipelineScheduler",
    "RoundMeasurement",
    "StageMeasurement",
    "StagePlan",
]

logger = logging.getLogger(__name__)

StagePlan = list[list[tuple[str, int]]]
"""Per pipeline stage, the (instruction, freq_mhz) list of one iteration in execution order."""


@dataclass(frozen=True)
class StageMeasurement:
    """One round's numbers for one pipeline stage (see the module docstring for the 3D rule).

    `time_s`/`energy_j`: per instruction name, the mean over the window's iterations and
    occurrences. `busy_s`/`compute_energy_j`: per iteration, the stage's total instruction
    time (busiest rank) and energy (tp ranks of the first pipeline).
    """

    time_s: dict[str, float]
    energy_j: dict[str, float]
    busy_s: float
    compute_energy_j: float
    iteration_energy_j: float


@dataclass(frozen=True)
class RoundMeasurement:
    """One complete round (every rank reported), aggregated.

    Attributes:
        stages: One entry per pipeline stage.
        iteration_time_s: Mean iteration time, max over all ranks.
        pipeline_energy_j: Mean iteration energy of one pipeline (first dp pipeline, all
            its GPUs).
        job_energy_j: Mean iteration energy of all GPUs of the job.
        busy_s: (dp_rank, pp_rank) → per-iteration instruction time of that stage copy
            (its busiest tp rank); used to spot a slow data-parallel pipeline.
        p2p_power_w: The median over ranks of the power a GPU drew while not computing,
            ``(iter_energy − Σ eᵢ) / (iter_time − Σ tᵢ)``, or None if no rank had idle time.
    """

    stages: list[StageMeasurement]
    iteration_time_s: float
    pipeline_energy_j: float
    job_energy_j: float
    busy_s: dict[tuple[int, int], float]
    p2p_power_w: float | None


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values)


class PipelineScheduler(FrequencyScheduler):
    """Base of pipeline schedulers: stage-level plans, applied to every rank (3D aware).

    Subclasses implement `plan_next()` (the stage plan of the round being issued) and
    `on_measurement()` (the last round's aggregated results, or None when it is incomplete),
    and may override `pipeline_overrides()`.
    """

    Args: ClassVar[type[SchedulerArgs]] = PipelineArgs

    def __init__(
        self,
        job_info: JobInfo,
        rank_infos: list[RankInfo],
        perseus_settings: PerseusSettings,
        args: PipelineArgs,
    ) -> None:
        super().__init__(job_info, rank_infos, perseus_settings, args)
        if len(self.rank_infos) != job_info.world_size:
            raise RankError(
                f"Job {job_info.job_id}: {len(self.rank_infos)} rank(s) registered but "
                f"world_size is {job_info.world_size}"
            )
        self.pipeline: PipelineSchedule = make_schedule(
            args.schedule, job_info.pp_degree, args.num_microbatches
        )
        self.num_stages = job_info.pp_degree
        self.kinds = self.pipeline.kinds()
        self.stage_ranks: list[list[RankInfo]] = [[] for _ in range(self.num_stages)]
        for info in self.rank_infos:
            self.stage_ranks[info.pp_rank].append(info)
        common = set.intersection(*(set(r.available_frequencies) for r in self.rank_infos))
        if not common:
            raise ConfigurationError(
                f"Job {job_info.job_id}: the ranks' GPUs share no available frequency; "
                "Perseus needs one set of SM clocks that every GPU supports"
            )
        self.frequencies: list[int] = sorted(common, reverse=True)
        """SM frequencies (MHz) every GPU of the job supports, descending."""
        self.max_freq_mhz = self.frequencies[0]
        self._issued = False
        self._observed = False
        self.rounds_issued = 0

    # ------------------------------------------------------------------ subclass API
    @abc.abstractmethod
    def plan_next(self) -> StagePlan:
        """The stage plan of the round being issued now."""

    @abc.abstractmethod
    def on_measurement(
        self, measurement: RoundMeasurement | None, results: list[ProfilingResult]
    ) -> None:
        """The last issued round's results (None: not every rank reported)."""

    def pipeline_overrides(self) -> dict[int, StagePlan]:
        """Data-parallel rank → its own stage plan for this round (default: none)."""
        return {}

    # ------------------------------------------------------------------ FrequencyScheduler
    def next_schedule(self) -> list[FrequencySchedule]:
        if self._issued and not self._observed:
            self.on_measurement(None, [])
        plan = self.plan_next()
        overrides = self.pipeline_overrides()
        self._issued, self._observed = True, False
        self.rounds_issued += 1
        return self.schedules_for(plan, overrides)

    def observe(self, profiling_results: list[ProfilingResult]) -> None:
        self._observed = True
        self.on_measurement(self.measure(profiling_results), profiling_results)

    # ------------------------------------------------------------------ helpers
    @property
    def job_dir(self) -> JobDir:
        """The job's directory, where its products (profile, frontier) go."""
        return JobDir.of(self.settings.dump_dir, self.job_info.job_id)

    def uniform_plan(self, freq_mhz: list[int] | int) -> StagePlan:
        """Every instruction of stage s at ``freq_mhz[s]`` (or one frequency for all)."""
        freqs = [freq_mhz] * self.num_stages if isinstance(freq_mhz, int) else freq_mhz
        return [[(k, int(f)) for k in kinds] for kinds, f in zip(self.kinds, freqs, strict=True)]

    def max_plan(self) -> StagePlan:
        """Every instruction at the highest common frequency."""
        return self.uniform_plan(self.max_freq_mhz)

    def check_plan(self, plan: Plan) -> StagePlan:
        """Check a plan file against this job; `PlanError` naming the mismatch.

        The plan's stage count, schedule and microbatches must match the job and every
        frequency must be available on every GPU of the stage that runs it.
        """
        if plan.num_stages != self.num_stages:
            raise PlanError(
                f"The plan has {plan.num_stages} stage(s) but job {self.job_info.job_id} has "
                f"pp_degree {self.num_stages}"
            )
        schedule = plan.pipeline_schedule()
        if schedule.kinds() != self.kinds:
            raise PlanError(
                f"The plan is for {plan.schedule} with {plan.num_microbatches} microbatch(es), "
                f"but the job runs {self.pipeline.name} with {self.pipeline.num_microbatches}; "
                "set the scheduler's num_microbatches/schedule to match the plan"
            )
        for stage, entries in enumerate(plan.frequencies):
            for info in self.stage_ranks[stage]:
                available = set(info.available_frequencies)
                bad = sorted({f for _, f in entries if f not in available}, reverse=True)
                if bad:
                    raise PlanError(
                        f"Stage {stage}: frequencies {bad} MHz are not available on rank "
                        f"{info.rank}'s GPU (it supports {min(available)}..{max(available)} MHz)"
                    )
        return [[(name, int(f)) for name, f in entries] for entries in plan.frequencies]

    def schedules_for(
        self, plan: StagePlan, overrides: dict[int, StagePlan] | None = None
    ) -> list[FrequencySchedule]:
        """One `FrequencySchedule` per rank: every rank of a stage gets the stage's list."""
        overrides = overrides or {}
        cache: dict[tuple[int, int], FrequencySchedule] = {}
        out = []
        for info in self.rank_infos:
            p = overrides.get(info.dp_rank, plan)
            key = (id(p), info.pp_rank)
            if key not in cache:
                cache[key] = FrequencySchedule(rank=0, frequencies=p[info.pp_rank])
            out.append(cache[key].model_copy(update={"rank": info.rank}))
        return out

    def measure(self, results: list[ProfilingResult]) -> RoundMeasurement | None:
        """Aggregate one round's results (None when a rank did not report)."""
        by_rank = {r.rank: r for r in results}
        missing = [info.rank for info in self.rank_infos if info.rank not in by_rank]
        if missing:
            logger.warning(
                "Job %s: no result from rank(s) %s this round", self.job_info.job_id, missing
            )
            return None
        first_dp = min(info.dp_rank for info in self.rank_infos)
        per_rank: dict[int, tuple[dict[str, float], dict[str, float], float, float]] = {}
        p2p: list[float] = []
        for info in self.rank_infos:
            res = by_rank[info.rank]
            if not res.iter_time or len(res.iter_time) != len(res.iter_energy):
                raise RankError(
                    f"Rank {info.rank} reported {len(res.iter_time)} iteration time(s) and "
                    f"{len(res.iter_energy)} energies; report one of each per iteration"
                )
            iters = len(res.iter_time)
            times: dict[str, float] = {}
            energies: dict[str, float] = {}
            busy = energy = 0.0
            for name in INSTRUCTIONS:
                t = [x for it in res.time_breakdown.get(name, []) for x in it]
                e = [x for it in res.energy_breakdown.get(name, []) for x in it]
                if not t or len(t) != len(e):
                    raise RankError(
                        f"Rank {info.rank} reported {len(t)} {name!r} duration(s) and {len(e)} "
                        f"energies; time_breakdown and energy_breakdown need one entry per "
                        f"executed {name} (iteration × occurrence)"
                    )
                times[name], energies[name] = _mean(t), _mean(e)
                busy += math.fsum(t) / iters
                energy += math.fsum(e) / iters
            iter_time, iter_energy = _mean(res.iter_time), _mean(res.iter_energy)
            per_rank[info.rank] = (times, energies, busy, energy)
            idle = iter_time - busy
            if idle > 1e-6 * max(iter_time, 1e-12):
                p2p.append(max(0.0, (iter_energy - energy) / idle))
        stages = []
        busy_s: dict[tuple[int, int], float] = {}
        for stage, members in enumerate(self.stage_ranks):
            first = [m for m in members if m.dp_rank == first_dp]
            times = {name: max(per_rank[m.rank][0][name] for m in members) for name in INSTRUCTIONS}
            energies = {
                name: math.fsum(per_rank[m.rank][1][name] for m in first) for name in INSTRUCTIONS
            }
            for m in members:
                key = (m.dp_rank, stage)
                busy_s[key] = max(busy_s.get(key, 0.0), per_rank[m.rank][2])
            stages.append(
                StageMeasurement(
                    time_s=times,
                    energy_j=energies,
                    busy_s=max(per_rank[m.rank][2] for m in members),
                    compute_energy_j=math.fsum(per_rank[m.rank][3] for m in first),
                    iteration_energy_j=math.fsum(_mean(by_rank[m.rank].iter_energy) for m in first),
                )
            )
        return RoundMeasurement(
            stages=stages,
            iteration_time_s=max(_mean(r.iter_time) for r in results),
            pipeline_energy_j=math.fsum(s.iteration_energy_j for s in stages),
            job_energy_j=math.fsum(_mean(r.iter_energy) for r in results),
            busy_s=busy_s,
            p2p_power_w=statistics.median(p2p) if p2p else None,
        )
