"""The plans `Perseus` weighs, all scored by one model: the job's profile and costs.

`PlanModel` holds what every plan of a job is scored with (the profile, the pipeline, the
blocking power, and the `perseus.schedulers.perseus_scheduler.costs.CostModel` of clock switches and P2P hops) and
the frontier solved with them. It turns frontier points into plans, gives the all-max
reference and a plan's predicted saving and slowdown against it, the faster point the
guard asks for (re-scored with the measured costs) and the cheaper point the other
pipelines run while one straggles.

The frontier is solved in the coordinator (`PlanModel.solve`, small pipelines) or in a
process of its own (`SolveRequest`, `solve_in_process`: `perseus.schedulers.perseus_scheduler.solving`), and kept in
the job's ``frontier/`` compactly (every point's clocks in one ``plans.npz``,
`perseus.io.frontier_dir`): written whole under a new name beside it and renamed into
place (`perseus.io.atomic.replace_dir`), so that a reader (a restarted coordinator,
`PlanModel.of_plan`) finds the old frontier or the new one, never half of one.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perseus.domain.plan import Plan
from perseus.domain.profile import InstructionProfile
from perseus.domain.schedule import PipelineSchedule
from perseus.errors import PlanError, SolverError
from perseus.io.atomic import replace_dir, sibling_tmp_dir
from perseus.protocol import JobInfo, RankInfo
from perseus.schedulers.args import PipelineArgs
from perseus.schedulers.perseus_scheduler.args import PerseusArgs
from perseus.schedulers.perseus_scheduler.costs import (
    CostModel,
    calibrate_costs,
    job_switch_latency,
    rescore_faster,
)

if TYPE_CHECKING:
    from perseus.planning import AfterWork, Frontier
    from perseus.schedulers.perseus_scheduler.stage_clocks import StageLimits

__all__ = [
    "PlanModel",
    "SolveRequest",
    "check_frontier_fits",
    "solve_in_process",
    "store_frontier",
]

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


@dataclass(frozen=True)
class SolveRequest:
    """Everything a frontier solve needs, as plain picklable data: what a solve's process
    (`solve_in_process`) is given."""

    job_id: str
    profile: InstructionProfile
    pipeline: PipelineSchedule
    p2p_power_w: float
    switch_latency_s: float
    hop_latency_s: float
    out_dir: Path
    """A new directory to write the frontier in (compactly); the caller renames it into
    place (`PlanModel.adopt_solved`)."""
    memory_budget_bytes: int | None = None
    """Refuse a frontier estimated to need more (`perseus.planning.check_frontier_memory`)."""
    per_stage: StageLimits | None = None
    """`PlanModel.per_stage`: per-stage constant-clock plans (`perseus.schedulers.perseus_scheduler.stage_clocks`)."""


def store_frontier(frontier: Frontier, out_dir: Path) -> None:
    """Keep `frontier` as the job's ``frontier/`` (`out_dir`): written compactly into a new
    directory beside it, then renamed over it (`replace_dir`), so that a failure or a crash
    at any point leaves the old frontier whole, and no reader ever finds half of one."""
    tmp = sibling_tmp_dir(out_dir)
    try:
        frontier.write(tmp, compact=True)
        replace_dir(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _check_memory(pipeline: PipelineSchedule, budget_bytes: int | None) -> None:
    """The memory re-check before a solve (the memory available may have changed since the
    job registered), its refusal raised as a `MemoryError`."""
    from perseus.planning import check_frontier_memory

    try:
        check_frontier_memory(pipeline.num_instructions, pipeline.name, budget_bytes=budget_bytes)
    except SolverError as exc:
        raise MemoryError(str(exc)) from None


def solve_in_process(request: SolveRequest) -> dict[str, Any]:
    """Solve `request`'s frontier and write it to ``request.out_dir`` (compactly); returns
    the solver's figures (points, seconds). Module-level, and given data only: it runs in a
    process of its own (`perseus.schedulers.perseus_scheduler.solve_pool`). The memory re-check's refusal is raised
    as a `MemoryError` (the failure's kind is ``memory``)."""
    from perseus.planning import solve_frontier

    t0 = time.perf_counter()
    _check_memory(request.pipeline, request.memory_budget_bytes)
    if request.per_stage is not None:
        from perseus.schedulers.perseus_scheduler.stage_clocks import stage_clock_frontier

        limits = request.per_stage
        frontier = stage_clock_frontier(
            request.profile,
            request.pipeline,
            request.p2p_power_w,
            switch_latency_s=request.switch_latency_s,
            hop_latency_s=request.hop_latency_s,
            deadline_s=limits.deadline_s,
            max_slowdown=limits.max_slowdown,
            sensitivity=limits.sensitivity,
        )
    else:
        frontier = solve_frontier(
            request.profile,
            request.pipeline,
            p2p_power_w=request.p2p_power_w,
            switch_latency_s=request.switch_latency_s,
            hop_latency_s=request.hop_latency_s,
        )
    frontier.write(request.out_dir, compact=True)
    return {"points": len(frontier), "seconds": time.perf_counter() - t0}


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
        self._all_max: tuple[InstructionProfile, tuple[Any, ...], Plan] | None = None
        self.per_stage: StageLimits | None = None
        """What a job whose plans are per-stage constant clocks aims at (`solve_per_stage`);
        None: per-instruction plans (the solver's frontier)."""
        self.after_work: AfterWork | None = None
        """What the GPUs draw after their work stops, as the profile's fit found it: counted
        in every plan's predicted saving (`predicted`); None: nothing."""

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
        """The all-max plan, scored like every other plan of the job (asked for every round:
        kept until the profile, the blocking power or the costs change)."""
        from perseus.planning import all_max_plan

        profile = self._profile()
        key = (self.p2p_power_w, self.costs.switch_latency_s, self.costs.hop_latency_s)
        cached = self._all_max
        if cached is None or cached[0] is not profile or cached[1] != key:
            plan = all_max_plan(
                profile,
                self.pipeline,
                self.p2p_power_w,
                switch_latency_s=self.costs.switch_latency_s,
                hop_latency_s=self.costs.hop_latency_s,
            )
            self._all_max = cached = (profile, key, plan)
        return cached[2]

    def predicted(self, plan: Plan) -> tuple[float, float]:
        """(saving, slowdown) of `plan` against all-max, both scored by the same model, the
        energy the GPUs draw after their work stops (`after_work`) counted in both."""
        base = self.all_max()
        energy = plan.energy + self.after_work_j(plan)
        base_energy = base.energy + self.after_work_j(base)
        return 1.0 - energy / base_energy, plan.iteration_time / base.iteration_time - 1.0

    def after_work_j(self, plan: Plan) -> float:
        """The energy above blocking `plan`'s GPUs draw after their instructions stop, per
        iteration (`perseus.planning.after_work`; 0 without `after_work`)."""
        after = self.after_work
        if after is None or after.is_empty():
            return 0.0
        from perseus.planning import after_work_energy_j, pipeline_problem

        problem = pipeline_problem(
            self._profile(), self.pipeline, plan.p2p_power, hop_latency_s=plan.hop_latency
        )
        return after_work_energy_j(problem, plan.stage_frequencies(), after)

    def solve_request(
        self, out_dir: Path, *, memory_budget_bytes: int | None = None
    ) -> SolveRequest:
        """What a solve's process needs to solve this model's frontier into a new directory
        beside `out_dir` (`solve_in_process`; `adopt_solved` puts it in place)."""
        self._log_solve()
        return SolveRequest(
            job_id=self.job_id,
            profile=self._profile(),
            pipeline=self.pipeline,
            p2p_power_w=self.p2p_power_w,
            switch_latency_s=self.costs.switch_latency_s,
            hop_latency_s=self.costs.hop_latency_s,
            out_dir=sibling_tmp_dir(out_dir),
            memory_budget_bytes=memory_budget_bytes,
            per_stage=self.per_stage,
        )

    def adopt_solved(self, request: SolveRequest, out_dir: Path) -> Frontier:
        """Put the frontier a solve's process wrote for `request` at `out_dir` (a rename)
        and read it back."""
        from perseus.planning import Frontier

        replace_dir(request.out_dir, out_dir)
        self.frontier = Frontier.read(out_dir)
        return self.frontier

    def solve(self, out_dir: Path, *, memory_budget_bytes: int | None = None) -> Frontier:
        """Solve the frontier with the job's costs, here, and write it to `out_dir`
        (compactly, atomically: see the module docstring); a frontier estimated to need
        more than `memory_budget_bytes` raises `MemoryError`. Per-stage plans
        (`per_stage`): `solve_per_stage`."""
        from perseus.planning import solve_frontier

        if self.per_stage is not None:
            return self.solve_per_stage(out_dir)
        self._log_solve()
        _check_memory(self.pipeline, memory_budget_bytes)
        frontier = solve_frontier(
            self._profile(),
            self.pipeline,
            p2p_power_w=self.p2p_power_w,
            switch_latency_s=self.costs.switch_latency_s,
            hop_latency_s=self.costs.hop_latency_s,
        )
        store_frontier(frontier, out_dir)
        self.frontier = frontier
        return frontier

    def _log_solve(self) -> None:
        logger.info(
            "Job %s: solving the frontier (%d stages × %d microbatches, P_block %.1f W)",
            self.job_id,
            self.pipeline.num_stages,
            self.pipeline.num_microbatches,
            self.p2p_power_w,
        )

    def solve_per_stage(self, out_dir: Path) -> Frontier:
        """The frontier of per-stage constant-clock plans (`perseus.schedulers.perseus_scheduler.stage_clocks`: a
        job whose instructions are too short to plan one by one; `per_stage` holds its
        time limit and the stages' measured time sensitivity), written to `out_dir` as
        `solve` writes one."""
        from perseus.schedulers.perseus_scheduler.stage_clocks import (
            StageLimits,
            stage_clock_frontier,
        )

        limits = self.per_stage or StageLimits(None, 0.0)
        frontier = stage_clock_frontier(
            self._profile(),
            self.pipeline,
            self.p2p_power_w,
            switch_latency_s=self.costs.switch_latency_s,
            hop_latency_s=self.costs.hop_latency_s,
            deadline_s=limits.deadline_s,
            max_slowdown=limits.max_slowdown,
            sensitivity=limits.sensitivity,
        )
        logger.info(
            "Job %s: %d per-stage constant-clock plan(s) on the frontier (%d scored)",
            self.job_id,
            len(frontier),
            int(frontier.stats.get("plans_scored", 0)),
        )
        store_frontier(frontier, out_dir)
        self.frontier = frontier
        return frontier

    def choose(self, *, deadline_s: float | None = None, max_slowdown: float = 0.0) -> Plan:
        """The cheapest frontier point within `deadline_s`, else within `max_slowdown` of
        the all-max plan, both as this model scores them: where the costs or the blocking
        power changed since the frontier was solved (the guard re-calibrated the hop
        latency on a deployed plan), every point is re-scored first, so that the slowdown
        the job predicts for the plan never exceeds the budget."""
        from perseus.planning.choice import choose_index

        frontier = self.frontier
        if frontier is None:
            raise PlanError(f"Job {self.job_id}: no frontier to choose a plan from")
        scored_as_solved = (
            frontier.switch_latency_s == self.costs.switch_latency_s
            and frontier.hop_latency_s == self.costs.hop_latency_s
            and frontier.p2p_power_w == self.p2p_power_w
        )
        bound = {"deadline_s": deadline_s} if deadline_s is not None else {}
        try:
            if scored_as_solved:
                point = frontier.choose(**(bound or {"max_slowdown": max_slowdown}))
                return self.plan_of(point.frequencies)
            plans = sorted(  # all-max among them: the frontier's fastest may no longer be
                [self.all_max(), *(self.plan_of(p.frequencies) for p in frontier.points)],
                key=lambda p: p.iteration_time,
            )
            k = choose_index(
                [p.iteration_time for p in plans],
                [p.energy for p in plans],
                **(bound or {"max_slowdown": max_slowdown}),
                reference_s=self.all_max().iteration_time,
            )
        except SolverError as exc:  # no point meets the deadline
            raise PlanError(f"Job {self.job_id}: {exc}") from None
        return plans[k]

    def faster(
        self,
        chosen: Plan,
        *,
        measured_time_s: float,
        limit_s: float,
        max_slowdown: float | None = None,
    ) -> Plan | None:
        """The cheapest frontier point faster than `chosen` that meets `limit_s` (and
        `max_slowdown` against this model's all-max) with the hop latency re-calibrated on
        `chosen`'s measured time (`rescore_faster`; the costs are updated when there is
        one); None without a frontier or such a point."""
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
            max_slowdown=max_slowdown,
        )
        return plan

    def stage_busy_s(self, plan: Plan) -> list[float] | None:
        """Each pipeline rank's busy time per iteration under `plan` (None: no profile)."""
        from perseus.planning import stage_busy_s

        if self.profile is None:
            return None
        return stage_busy_s(self.profile, self.pipeline, plan.stage_frequencies())
