"""`PointSolution`: run one plan file (a point of a frontier) on every round."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from perseus.domain.plan import Plan
from perseus.errors import PlanError
from perseus.io.plan_file import load_plan
from perseus.protocol import JobInfo, ProfilingResult, RankInfo
from perseus.settings import PerseusSettings
from schedulers.pipeline import PipelineScheduler, RoundMeasurement, StagePlan

__all__ = ["PointSolution"]


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

    def __init__(
        self,
        job_info: JobInfo,
        rank_infos: list[RankInfo],
        perseus_settings: PerseusSettings,
        *,
        solution_path: str,
        num_microbatches: Annotated[int, Field(ge=1)] | None = None,
        schedule: str | None = None,
    ) -> None:
        plan = load_plan(solution_path)
        if num_microbatches is not None and num_microbatches != plan.num_microbatches:
            raise PlanError(
                f"Plan {solution_path!r} has {plan.num_microbatches} microbatch(es) but the "
                f"scheduler was given num_microbatches={num_microbatches}"
            )
        super().__init__(
            job_info,
            rank_infos,
            perseus_settings,
            num_microbatches=plan.num_microbatches,
            schedule=schedule or plan.schedule,
        )
        self.plan = plan
        self._stage_plan = self.check_plan(plan)

    @classmethod
    def validate_args(cls, args: dict[str, Any]) -> None:
        """num_microbatches comes from the plan file: nothing beyond the types to check."""

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
