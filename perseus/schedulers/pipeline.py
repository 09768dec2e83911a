"""The base of every shipped scheduler: stage-level plans, round bookkeeping, plan checks.

Subclasses plan per pipeline rank (a `StagePlan`: per rank, its (kind, MHz) list in
execution order) and measure per pipeline rank and per pipeline (virtual) stage;
`perseus.schedulers.parallel.Parallel3D` wraps them for 3D parallelism (per-rank results → per-rank
and per-stage measurements, stage plans → per-rank schedules). The pipeline is the one the
job described at registration (any order: interleaved, zero-bubble, ...), else the
coordinator's default (`job_pipeline`).

Round protocol: `next_schedule()` issues round k; `observe()` gets round k's results before
round k+1 is issued. A round that got no `observe()` (no rank reported) is handed to the
subclass as a missing measurement.
"""

from __future__ import annotations

import abc
import logging
from typing import ClassVar

from perseus.domain.plan import Plan
from perseus.domain.schedule import PipelineSchedule, check_size, make_schedule
from perseus.errors import ConfigurationError, PlanError
from perseus.io.jobdir import JobDir
from perseus.protocol import FrequencySchedule, JobInfo, ProfilingResult, RankInfo
from perseus.schedulers.args import PipelineArgs, SchedulerArgs
from perseus.schedulers.base import FrequencyScheduler, has_breakdowns
from perseus.schedulers.measurement import (
    RoundMeasurement,
    StageMeasurement,
    StagePlan,
    VirtualStageMeasurement,
)
from perseus.schedulers.parallel import Parallel3D
from perseus.settings import PerseusSettings

__all__ = [
    "FixedPlanScheduler",
    "PipelineScheduler",
    "job_pipeline",
    "RoundMeasurement",
    "StageMeasurement",
    "StagePlan",
    "VirtualStageMeasurement",
]

logger = logging.getLogger(__name__)


def job_pipeline(job_info: JobInfo, args: PipelineArgs) -> PipelineSchedule:
    """The pipeline a job runs: the one it described at registration, else the one the
    coordinator's scheduler arguments give (`ConfigurationError` when neither does)."""
    if job_info.pipeline is not None:
        return job_info.pipeline.build()
    if args.num_microbatches is None:
        raise ConfigurationError(
            f"Job {job_info.job_id or '(new)'} did not describe its pipeline and the "
            "coordinator has no default one: register with a client that sends it "
            "(perseus.integrations.pipelining.attach, or PerseusOptimizer(pipeline=...)), "
            "or start the coordinator with PERSEUS_SCHEDULER_ARGS='{\"num_microbatches\": M}'"
        )
    return make_schedule(
        args.schedule, job_info.pp_degree, args.num_microbatches, num_chunks=args.num_chunks
    )


class PipelineScheduler(FrequencyScheduler):
    """Base of pipeline schedulers: stage-level plans, applied to every rank (3D aware).

    Subclasses implement `plan_next()` (the stage plan of the round being issued) and
    `on_measurement()` (the last round's aggregated results, or None when it is incomplete),
    and may override `pipeline_overrides()`.
    """

    Args: ClassVar[type[SchedulerArgs]] = PipelineArgs
    needs_breakdowns: ClassVar[str | None] = (
        "it measures each instruction's time and energy, per pipeline stage, from them"
    )

    def __init__(
        self,
        job_info: JobInfo,
        rank_infos: list[RankInfo],
        perseus_settings: PerseusSettings,
        args: PipelineArgs,
        *,
        pipeline: PipelineSchedule | None = None,
    ) -> None:
        super().__init__(job_info, rank_infos, perseus_settings, args)
        self.pipeline: PipelineSchedule = (
            pipeline if pipeline is not None else job_pipeline(job_info, args)
        )
        self.parallel = Parallel3D(job_info, self.rank_infos, self.pipeline)
        """The 3D mapping: per-rank results → pipeline ranks and (virtual) stages, stage
        plans → per-rank schedules."""
        self.num_stages = job_info.pp_degree
        """Pipeline ranks: a plan has one list per rank (a profile one stage per
        `pipeline.num_virtual_stages`)."""
        self.kinds = self.pipeline.kinds()
        self.stage_ranks = self.parallel.stage_ranks
        self.frequencies = self.parallel.frequencies
        """SM frequencies (MHz) every GPU of the job supports, descending."""
        self.max_freq_mhz = self.frequencies[0]
        self._issued = False
        self._observed = False
        self._issued_frequencies: dict[int, list[tuple[str, int]]] = {}
        """Per rank, the (kind, MHz) list of the round last issued."""

    @classmethod
    def check_job(cls, job_info: JobInfo, args: SchedulerArgs) -> None:
        """A job must describe its pipeline unless the coordinator has a default one."""
        if not isinstance(args, PipelineArgs):
            raise ConfigurationError(
                f"{cls.__name__} takes pipeline arguments, got {type(args).__name__}"
            )
        if job_info.pipeline is None:
            if args.num_microbatches is None:
                job_pipeline(job_info, args)  # raises, saying what to do
            else:
                check_size(
                    args.schedule,
                    job_info.pp_degree,
                    args.num_microbatches,
                    num_chunks=args.num_chunks,
                )

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

    def round_steps(self) -> int | None:
        """Iterations the round being issued should run at least (None: the ranks' own
        `steps_per_round`). Called after `plan_next`."""
        return None

    # ------------------------------------------------------------------ FrequencyScheduler
    def next_schedule(self) -> list[FrequencySchedule]:
        if self._issued and not self._observed:
            self.on_measurement(None, [])
        plan = self.plan_next()
        overrides = self.pipeline_overrides()
        self._issued, self._observed = True, False
        schedules = self.parallel.schedules_for(plan, overrides, steps=self.round_steps())
        self._issued_frequencies = {s.rank: s.frequencies for s in schedules}
        return schedules

    def check_result(self, result: ProfilingResult) -> None:
        """The rank must be the job's; breakdowns, when the scheduler needs them or the
        client sends them, must hold one entry per instruction of its order, per iteration
        (`Parallel3D.check_result`)."""
        super().check_result(result)
        self.parallel.check_result(result, breakdowns=has_breakdowns(result))

    def observe(self, profiling_results: list[ProfilingResult]) -> None:
        self._observed = True
        complete = all(has_breakdowns(r) for r in profiling_results)
        measurement = (
            self.parallel.measure(profiling_results, self._issued_frequencies) if complete else None
        )
        self.on_measurement(measurement, profiling_results)

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
        if schedule.actions() != self.pipeline.actions():
            raise PlanError(
                f"The plan is for {plan.schedule} with {plan.num_microbatches} microbatch(es), "
                f"but the job runs {self.pipeline.name} with {self.pipeline.num_microbatches}; "
                "deploy a plan made for the job's pipeline"
            )
        return self._check_clocks(plan.frequencies)

    def check_clock_lists(self, frequencies: list[list[tuple[str, int]]], source: str) -> StagePlan:
        """Check clocks given without a pipeline (a Zeus-style literal plan, `source`) against
        this job's pipeline; `PlanError` naming the mismatch.

        There must be one list per pipeline rank, each naming the kinds of that rank's order
        in order, and every frequency must be available on every GPU of the rank.
        """
        if len(frequencies) != self.num_stages:
            raise PlanError(
                f"{source} lists clocks for {len(frequencies)} pipeline rank(s) but job "
                f"{self.job_info.job_id} has pp_degree {self.num_stages}"
            )
        for rank, (order, entries) in enumerate(
            zip(self.pipeline.orders, frequencies, strict=True)
        ):
            if len(entries) != len(order):
                raise PlanError(
                    f"{source}: pipeline rank {rank} has {len(entries)} clock(s) but the job's "
                    f"{self.pipeline.name} schedule with {self.pipeline.num_microbatches} "
                    f"microbatch(es) runs {len(order)} instruction(s) there"
                )
            for k, (instr, (name, _)) in enumerate(zip(order, entries, strict=True)):
                if instr.kind != name:
                    raise PlanError(
                        f"{source}: pipeline rank {rank}, instruction #{k} is {name!r} but the "
                        f"job's {self.pipeline.name} schedule runs {instr.kind!r} there"
                    )
        return self._check_clocks(frequencies)

    def _check_clocks(self, frequencies: list[list[tuple[str, int]]]) -> StagePlan:
        for stage, entries in enumerate(frequencies):
            for info in self.stage_ranks[stage]:
                available = set(info.available_frequencies)
                bad = sorted({f for _, f in entries if f not in available}, reverse=True)
                if bad:
                    raise PlanError(
                        f"Stage {stage}: frequencies {bad} MHz are not available on rank "
                        f"{info.rank}'s GPU (it supports {min(available)}..{max(available)} MHz)"
                    )
        return [[(name, int(f)) for name, f in entries] for entries in frequencies]


class FixedPlanScheduler(PipelineScheduler):
    """Runs one stage plan (`fixed_plan`, set by the subclass) every round and measures
    nothing: results are accepted and ignored."""

    fixed_plan: StagePlan

    def plan_next(self) -> StagePlan:
        return self.fixed_plan

    def observe(self, profiling_results: list[ProfilingResult]) -> None:
        self._observed = True

    def on_measurement(
        self, measurement: RoundMeasurement | None, results: list[ProfilingResult]
    ) -> None:
        return None
