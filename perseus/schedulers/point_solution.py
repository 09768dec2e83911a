"""`PointSolution`: run one plan file (a point of a frontier) on every round."""

from __future__ import annotations

from pydantic import Field

from perseus.domain.plan import Plan
from perseus.errors import PlanError
from perseus.io.plan_file import FrequencyLists, read_plan
from perseus.protocol import JobInfo, RankInfo
from perseus.schedulers.args import PipelineArgs, SchedulerArgs
from perseus.schedulers.base import RoundReport
from perseus.schedulers.pipeline import FixedPlanScheduler, job_pipeline
from perseus.settings import PerseusSettings

__all__ = ["PointSolution", "PointSolutionArgs"]


class PointSolutionArgs(SchedulerArgs):
    """`PointSolution`'s arguments: the plan file; the pipeline defaults to the plan's."""

    solution_path: str = Field(description="the plan to deploy: JSON, or a Zeus-style literal")
    num_microbatches: int | None = Field(
        default=None,
        ge=1,
        description="checked against a JSON plan's (None: the plan's); a literal plan's "
        "pipeline when the job does not describe one",
    )
    schedule: str | None = Field(
        default=None, description="None: the plan's schedule (1f1b for a literal)"
    )


class PointSolution(FixedPlanScheduler):
    """Deploy the plan at `solution_path` (data, never code; `perseus.io.plan_file`).

    A JSON plan (`perseus.domain.plan.Plan`) is validated against the job when the
    scheduler is built: its stage count must equal pp_degree, its schedule/microbatches must
    match, and every frequency must be available on every GPU of the stage that runs it
    (else a 400 to every rank). A Zeus / lowtime style Python literal
    (``[[("forward", 1410), ...], ...]``, one list per pipeline rank) says only the clocks:
    it runs on the pipeline the job described, else the one `num_microbatches` and
    `schedule` give, and is checked against it the same way; having no predicted time and
    energy, it is not reported as a deployed plan.

    Results need no breakdowns (Zeus's clients send none by default).

    Args (``PERSEUS_SCHEDULER_ARGS``):
        solution_path: Path of the plan (e.g. ``frontier/plans/plan_00003.json``).
        num_microbatches: Microbatches per iteration; default: the plan's.
        schedule: Pipeline schedule; default: the plan's.
    """

    Args = PointSolutionArgs
    needs_breakdowns = None

    def __init__(
        self,
        job_info: JobInfo,
        rank_infos: list[RankInfo],
        perseus_settings: PerseusSettings,
        args: PointSolutionArgs,
    ) -> None:
        plan = read_plan(args.solution_path)
        if not isinstance(plan, Plan):
            self._init_literal(job_info, rank_infos, perseus_settings, args, plan)
            return
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
        self.plan: Plan | None = plan
        self.fixed_plan = self.check_plan(plan)

    def _init_literal(
        self,
        job_info: JobInfo,
        rank_infos: list[RankInfo],
        perseus_settings: PerseusSettings,
        args: PointSolutionArgs,
        clocks: FrequencyLists,
    ) -> None:
        source = f"Plan {args.solution_path!r} (a Python literal)"
        if job_info.pipeline is None and args.num_microbatches is None:
            raise PlanError(
                f"{source} lists clocks but not the pipeline they are for: register the job "
                "with its pipeline, or give PointSolution num_microbatches (and schedule, "
                "default 1f1b) in PERSEUS_SCHEDULER_ARGS"
            )
        pipeline = PipelineArgs(
            num_microbatches=args.num_microbatches, schedule=args.schedule or "1f1b"
        )
        super().__init__(job_info, rank_infos, perseus_settings, pipeline)
        self.args = args
        self.plan = None
        self.fixed_plan = self.check_clock_lists(clocks, source)

    @classmethod
    def check_job(cls, job_info: JobInfo, args: SchedulerArgs) -> None:
        """Any job: the plan says the pipeline (checked when the ranks have registered)."""

    def deployed_plan(self) -> Plan | None:
        """The plan the job runs (None until it is read)."""
        return self.plan

    def report(self) -> RoundReport:
        return RoundReport(plan=self.plan)

    def resume(self, plan: Plan) -> None:
        """Resume at a persisted plan (it must still fit the job)."""
        self.fixed_plan = self.check_plan(plan)
        self.plan = plan
