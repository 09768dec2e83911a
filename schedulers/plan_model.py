"""The plans `Perseus` weighs, all scored by one model: the job's profile and costs.

`PlanModel` holds what every plan of a job is scored with (the profile, the pipeline, the
blocking power, and the `schedulers.costs.CostModel` of clock switches and P2P hops) and
the frontier solved with them. It turns frontier points into plans, gives the all-max
reference and a plan's predicted saving and slowdown against it, the faster point the
guard asks for (re-scored with the measured costs) and the cheaper point the other
pipelines run while one straggles.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from perseus.domain.plan import Plan
from perseus.domain.profile import InstructionProfile
from perseus.domain.schedule import PipelineSchedule
from perseus.errors import PlanError
from perseus.protocol import JobInfo, RankInfo
from schedulers.args import PipelineArgs
from schedulers.costs import CostModel, calibrate_costs, job_switch_latency, rescore_faster
from schedulers.perseus_args import PerseusArgs

if TYPE_CHECKING:
    from perseus.planning import Frontier

__all__ = ["PlanModel", "check_frontier_fits"]

logger = logging.getLogger(__name__)


def check_frontier_fits(job_info: JobInfo, args: PipelineArgs) -> None:
    """Refuse, at registration, a job whose frontier would not fit in memory (counted from
    its orders or the default schedule's shape, without building it)."""
    from perseus.domain.schedule import instructions_per_stage
    from perseus.planning import check_frontier_memory

    if job_info.pipeline is not None:
        name = job_info.pipeline.schedule
        count = sum(len(order) for order in job_info.pipeline.orders)
    else:
        name = args.schedule
        count = job_info.pp_degree * instructions_per_stage(
            args.schedule, args.num_microbatches or 1, args.num_chunks
        )
    check_frontier_memory(count, name)


class PlanModel:
    """One job's plan scoring (see the module docstring).

    Args:
        job_id: The job, for errors.
        pipeline: The job's pipeline schedule.
        profile: Its instruction profile (None: none to plan with; a resumed job may lack it).
        p2p_power_w: A stage's blocking power, W.
        costs: The clock-switch and hop latencies plans are scored with.
        frontier: The frontier solved already (None: `solve` it).
    """

    def __init__(
        self,
        job_id: str,
        pipeline: PipelineSchedule,
        profile: InstructionProfile | None,
        p2p_power_w: float,
        costs: CostModel,
        frontier: Frontier | None = None,
    ) -> None:
        self.job_id = job_id
        self.pipeline = pipeline
        self.profile = profile
        self.p2p_power_w = p2p_power_w
        self.costs = costs
        self.frontier = frontier

    @classmethod
    def calibrated(
        cls,
        job_id: str,
        pipeline: PipelineSchedule,
        profile: InstructionProfile,
        p2p_power_w: float,
        args: PerseusArgs,
        *,
        rank_infos: Sequence[RankInfo],
        baseline_time_s: float | None,
        rounds: Sequence[tuple[list[list[int]], float]],
    ) -> PlanModel:
        """The model with costs calibrated on the job (`calibrate_costs`): the switch
        latency given, else the slowest the ranks measured (else 0, "unknown"); the hop
        latency given, else calibrated on the all-max rounds (`baseline_time_s`)."""
        switch, source = job_switch_latency(args.switch_latency_ms, rank_infos)
        hop_latency_ms = args.hop_latency_ms
        costs = calibrate_costs(
            profile,
            pipeline,
            p2p_power_w,
            switch_latency_s=switch,
            switch_source=source,
            hop_latency_s=None if hop_latency_ms is None else hop_latency_ms / 1000.0,
            baseline_time_s=baseline_time_s,
            rounds=rounds,
        )
        return cls(job_id, pipeline, profile, p2p_power_w, costs)

    @classmethod
    def of_plan(
        cls,
        job_id: str,
        pipeline: PipelineSchedule,
        profile: InstructionProfile | None,
        plan: Plan,
        frontier_dir: Path,
    ) -> PlanModel:
        """The model a persisted `plan` was scored with, and its frontier when
        `frontier_dir` holds one (a restarted coordinator)."""
        frontier = None
        if (frontier_dir / "frontier.csv").exists():
            from perseus.planning import Frontier

            frontier = Frontier.read(frontier_dir)
        costs = CostModel(
            switch_latency_s=plan.switch_latency,
            switch_source="from the plan",
            hop_latency_s=plan.hop_latency,
            hop_source="from the plan",
        )
        return cls(job_id, pipeline, profile, plan.p2p_power, costs, frontier)

    def _profile(self) -> InstructionProfile:
        if self.profile is None:
            raise PlanError(f"Job {self.job_id}: no profile to plan with")
        return self.profile

    def plan_of(self, frequencies: list[list[int]]) -> Plan:
        """`frequencies` scored with the job's costs."""
        from perseus.planning import make_plan

        return make_plan(
            self._profile(),
            self.pipeline,
            frequencies,
            self.p2p_power_w,
            switch_latency_s=self.costs.switch_latency_s,
            hop_latency_s=self.costs.hop_latency_s,
        )

    def all_max(self) -> Plan:
        """The all-max plan, scored like every other plan of the job."""
        from perseus.planning import all_max_plan

        return all_max_plan(
            self._profile(),
            self.pipeline,
            self.p2p_power_w,
            switch_latency_s=self.costs.switch_latency_s,
            hop_latency_s=self.costs.hop_latency_s,
        )

    def predicted(self, plan: Plan) -> tuple[float, float]:
        """(saving, slowdown) of `plan` against all-max, both scored by the same model."""
        base = self.all_max()
        return 1.0 - plan.energy / base.energy, plan.iteration_time / base.iteration_time - 1.0

    def solve(self, out_dir: Path) -> Frontier:
        """Solve the frontier with the job's costs and write it to `out_dir`."""
        from perseus.planning import solve_frontier

        logger.info(
            "Job %s: solving the frontier (%d stages × %d microbatches, P_block %.1f W)",
            self.job_id,
            self.pipeline.num_stages,
            self.pipeline.num_microbatches,
            self.p2p_power_w,
        )
        self.frontier = solve_frontier(
            self._profile(),
            self.pipeline,
            p2p_power_w=self.p2p_power_w,
            switch_latency_s=self.costs.switch_latency_s,
            hop_latency_s=self.costs.hop_latency_s,
        )
        self.frontier.write(out_dir)
        return self.frontier

    def choose(self, *, deadline_s: float | None = None, max_slowdown: float = 0.0) -> Plan:
        """The cheapest frontier point within `deadline_s`, else within `max_slowdown`."""
        if self.frontier is None:
            raise PlanError(f"Job {self.job_id}: no frontier to choose a plan from")
        if deadline_s is not None:
            point = self.frontier.choose(deadline_s=deadline_s)
        else:
            point = self.frontier.choose(max_slowdown=max_slowdown)
        return self.plan_of(point.frequencies)

    def faster(self, chosen: Plan, *, measured_time_s: float, limit_s: float) -> Plan | None:
        """The cheapest frontier point faster than `chosen` that meets `limit_s` with the
        hop latency re-calibrated on `chosen`'s measured time (`rescore_faster`; the costs
        are updated when there is one); None without a frontier or such a point."""
        if self.frontier is None:
            return None
        plan, self.costs = rescore_faster(
            self._profile(),
            self.pipeline,
            self.p2p_power_w,
            self.costs,
            chosen=chosen,
            candidates=[p.frequencies for p in self.frontier.points],
            measured_time_s=measured_time_s,
            limit_s=limit_s,
        )
        return plan

    def stage_busy_s(self, plan: Plan) -> list[float] | None:
        """Each pipeline rank's busy time per iteration under `plan` (None: no profile)."""
        from perseus.planning import stage_busy_s

        if self.profile is None:
            return None
        return stage_busy_s(self.profile, self.pipeline, plan.stage_frequencies())
