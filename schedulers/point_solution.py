"""`PointSolution`: run one plan file (a point of a frontier) on every round."""

from __future__ import annotations

from pydantic import Field

from perseus.domain.plan import Plan
from perseus.errors import PlanError
from perseus.io.plan_file import load_plan
from perseus.protocol import JobInfo, ProfilingResult, RankInfo
from perseus.settings import PerseusSettings
from schedulers.args import PipelineArgs, SchedulerArgs
from schedulers.pipeline import PipelineScheduler, RoundMeasurement, StagePlan, job_pipeline

__all__ = ["PointSolution", "PointSolutionArgs"]


class PointSolutionArgs(SchedulerArgs):
    """`PointSolution`'s arguments: the plan file; the pipeline defaults to the plan's."""

    solution_path: str = Field(description="the plan JSON to deploy")
    num_microbatches: int | None = Field(
        default=None, ge=1, description="checked against the plan's (None: the plan's)"
    )
    schedule: str | None = Field(default=None, description="None: the plan's schedule")


class PointSolution(PipelineScheduler):
    """Deploy the plan JSON at `solution_path` (`perseus.domain.plan.Plan`, data, never code).

    The plan is validated against the job when the scheduler is built: its stage count must
    equal pp_degree, its schedule/microbatches must match, and every frequency must be
    available on every GPU of the stage that runs it (else a 400 to every rank).

    Args (``PERSEUS_SCHEDULER_ARGS``):
        solution_path: Path of the plan JSON (e.g. ``frontier/plans/plan_00003.json``).
        num_microbatches: Microbatches per iteration; default: the plan's.
        schedule: Pipeline schedule; default: the plan's.
    """

    Args = PointSolutionArgs

    def __init__(
        self,
        job_info: JobInfo,
        rank_infos: list[RankInfo],
        perseus_settings: PerseusSettings,
        args: PointSolutionArgs,
    ) -> None:
        plan = load_plan(args.solution_path)
        if args.num_microbatches is not None and args.num_microbatches != plan.num_microbatches:
            raise PlanError(
                f"Plan {args.solution_path!r} has {plan.num_microbatches} microbatch(es) but the "
                f"scheduler was given num_microbatches={args.num_microbatches}"
            )
        if job_info.pipeline is not None:
            schedule = job_info.pipeline.build()
        elif plan.orders is not None or args.schedule is None:
            schedule = plan.pipeline_schedule()
        else:
            schedule = job_pipeline(
                job_info,
                PipelineArgs(
                    num_microbatches=plan.num_microbatches,
                    schedule=args.schedule,
                    num_chunks=plan.num_chunks,
                ),
            )
        pipeline = PipelineArgs(num_microbatches=plan.num_microbatches, schedule="1f1b")
        super().__init__(job_info, rank_infos, perseus_settings, pipeline, pipeline=schedule)
        self.args = args
        self.plan = plan
        self._stage_plan = self.check_plan(plan)

    @classmethod
    def check_job(cls, job_info: JobInfo, args: SchedulerArgs) -> None:
        """Any job: the plan says the pipeline (checked when the ranks have registered)."""

    def plan_next(self) -> StagePlan:
        return self._stage_plan

    def observe(self, profiling_results: list[ProfilingResult]) -> None:
        self._observed = True

    def on_measurement(
        self, measurement: RoundMeasurement | None, results: list[ProfilingResult]
    ) -> None:
        return None

    def deployed_plan(self) -> Plan:
        return self.plan

    def resume(self, plan: Plan) -> None:
        """Resume at a persisted plan (it must still fit the job)."""
        self._stage_plan = self.check_plan(plan)
        self.plan = plan
