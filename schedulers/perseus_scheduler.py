"""`Perseus`: profile online, solve the time–energy frontier, deploy a plan, track stragglers."""

from __future__ import annotations

import enum
import logging
import math

from pydantic import Field, field_validator

from perseus.domain.plan import Plan
from perseus.domain.units import max_slowdown_problem
from perseus.errors import ConfigurationError
from perseus.io.profile_csv import load_profile
from perseus.protocol import JobInfo, ProfilingResult, RankInfo
from perseus.settings import PerseusSettings
from schedulers.args import SchedulerArgs
from schedulers.pipeline import RoundMeasurement, StagePlan
from schedulers.planning import DEFAULT_P2P_POWER_W, PlanningArgs, PlanningScheduler

__all__ = ["DEFAULT_P2P_POWER_W", "Perseus", "PerseusArgs", "PerseusPhase"]

logger = logging.getLogger(__name__)


class PerseusPhase(enum.Enum):
    """PROFILING → DEPLOYED.

    PROFILING: the instruction sweep runs (skipped to a single all-max measuring round when
    `profile_path` is given, and entirely when `p2p_power` is given too). At the end of the
    round that completes it, the frontier is solved (synchronously, inside the scheduler
    call the coordinator runs in a worker thread) and the chosen plan deployed.
    DEPLOYED (terminal): every round runs the chosen plan; while a data-parallel pipeline
    straggles, the other pipelines run the slower, cheaper plan that still meets it.
    """

    PROFILING = "profiling"
    DEPLOYED = "deployed"


class PerseusArgs(PlanningArgs):
    """`Perseus`'s arguments: the planning ones, the choice of a frontier point, stragglers."""

    max_slowdown: float = Field(
        default=0.0, ge=0.0, description="allowed slowdown vs fastest, a fraction (0.05 = 5 %)"
    )
    deadline: float | None = Field(
        default=None, gt=0.0, description="iteration time bound, s (overrides max_slowdown)"
    )
    straggler_threshold: float = Field(
        default=0.05, gt=0.0, description="relative slowness that marks a straggler"
    )
    straggler_rounds: int = Field(
        default=2, ge=1, description="rounds in a row to detect a straggler or its recovery"
    )
    switch_latency_ms: float = Field(
        default=0.0,
        ge=0.0,
        le=10_000.0,
        description="time a clock change takes to apply, ms (10-20 on real GPUs); the plan "
        "counts it (perseus.planning.switching). 0: changes are free",
    )

    @field_validator("max_slowdown")
    @classmethod
    def _slowdown_is_a_fraction(cls, value: float) -> float:
        problem = max_slowdown_problem(value)
        if problem:
            raise ValueError(problem)
        return value


class Perseus(PlanningScheduler):
    """The whole Perseus loop online.

    1. Profile every instruction at every frequency (`schedulers.sweep`), or read a profile.
    2. Blocking power `p2p_power`: if not given, measured from the all-max rounds as
       ``(iter_energy − Σ eᵢ) / (iter_time − Σ tᵢ)`` per GPU (× tp_degree per stage);
       `DEFAULT_P2P_POWER_W` only if no rank ever had idle time.
    3. `perseus.planning.solve_frontier` on the profile and the job's schedule; the frontier is
       written to ``dump_dir/<job_id>/frontier/`` (and the swept profile beside it).
    4. Choose: the minimum-energy point with T ≤ `deadline` seconds if given, else with
       T ≤ (1 + `max_slowdown`) × the fastest T; deploy it.
    5. Stragglers: when data-parallel pipeline d is slower than the others — announced with
       ``POST /straggler`` (`on_straggler`, sticky until a slowdown of 1.0 is announced) or
       detected from results (its instructions run more than `straggler_threshold` slower,
       relative to what its plan predicts, than the fastest pipeline's, for
       `straggler_rounds` rounds in a row) — every other pipeline runs the minimum-energy
       frontier point with T ≤ slowdown × T(chosen plan). When the straggler recovers
       (announced 1.0, or `straggler_rounds` rounds within the threshold) all pipelines
       return to the chosen plan.

    Args (``PERSEUS_SCHEDULER_ARGS``): `num_microbatches`, `schedule` (default "1f1b"),
    `max_slowdown` (default 0.0), `deadline` (seconds, overrides `max_slowdown`),
    `p2p_power` (W), `profile_path` (a profile CSV to use instead of sweeping), the sweep's
    `warmup_rounds`, `freq_step`, `min_frequency`, `early_stop_after`, `sweep` (default
    "coarse"), `coarse_step`, `stop_margin`, `refine`, `refine_tolerance`, and
    `straggler_threshold` (default 0.05), `straggler_rounds` (default 2).
    """

    Args = PerseusArgs

    @classmethod
    def check_job(cls, job_info: JobInfo, args: SchedulerArgs) -> None:
        """Also refuse, at registration, a job whose frontier would not fit in memory
        (counted from its orders or the default schedule's shape, without building it)."""
        super().check_job(job_info, args)
        from perseus.domain.schedule import instructions_per_stage
        from perseus.planning import check_frontier_memory

        assert isinstance(args, PerseusArgs)
        if job_info.pipeline is not None:
            name = job_info.pipeline.schedule
            count = sum(len(order) for order in job_info.pipeline.orders)
        else:
            assert args.num_microbatches is not None  # super() refused a job without one
            name = args.schedule
            count = job_info.pp_degree * instructions_per_stage(
                args.schedule, args.num_microbatches, args.num_chunks
            )
        check_frontier_memory(count, name)

    def __init__(
        self,
        job_info: JobInfo,
        rank_infos: list[RankInfo],
        perseus_settings: PerseusSettings,
        args: PerseusArgs,
    ) -> None:
        super().__init__(job_info, rank_infos, perseus_settings, args)
        from perseus.planning import check_frontier_memory

        # Now, not after the profiling sweep: a job too big to solve fails at registration.
        check_frontier_memory(self.pipeline.num_instructions, self.pipeline.name)
        self.max_slowdown = args.max_slowdown
        self.deadline_s = args.deadline
        self.switch_latency_s = args.switch_latency_ms / 1000.0
        self.straggler_threshold = args.straggler_threshold
        self.straggler_rounds = args.straggler_rounds
        self.init_profile_source(args)
        self.phase = PerseusPhase.PROFILING
        self.frontier = None
        self.announced: dict[int, float] = {}
        self.detected: dict[int, float] = {}
        self._streak: dict[int, int] = {}
        self._recover_streak: dict[int, int] = {}
        self._overrides: dict[int, StagePlan] = {}
        self._running: dict[int, Plan] = {}
        if self.sweep is None:
            self._deploy()

    # ------------------------------------------------------------------ rounds
    def plan_next(self) -> StagePlan:
        match self.phase:
            case PerseusPhase.PROFILING:
                assert self.sweep is not None
                if self.sweep.done:
                    self._deploy()
                    assert self._chosen_plan is not None
                    return self._chosen_plan
                return self.sweep.current_plan()
            case PerseusPhase.DEPLOYED:
                assert self._chosen_plan is not None
                return self._chosen_plan

    def pipeline_overrides(self) -> dict[int, StagePlan]:
        return self._overrides

    def on_measurement(
        self, measurement: RoundMeasurement | None, results: list[ProfilingResult]
    ) -> None:
        match self.phase:
            case PerseusPhase.PROFILING:
                assert self.sweep is not None
                self.sweep.observe(measurement)
            case PerseusPhase.DEPLOYED:
                if measurement is not None:
                    self._detect_stragglers(measurement)

    # ------------------------------------------------------------------ solve & deploy
    def _deploy(self) -> None:
        from perseus.planning import solve_frontier

        self.complete_profile()
        assert self.profile is not None and self.p2p_power_w is not None
        logger.info(
            "Job %s: solving the frontier (%d stages × %d microbatches, P_block %.1f W)",
            self.job_info.job_id,
            self.num_stages,
            self.pipeline.num_microbatches,
            self.p2p_power_w,
        )
        self.frontier = solve_frontier(
            self.profile,
            self.pipeline,
            p2p_power_w=self.p2p_power_w,
            switch_latency_s=self.switch_latency_s,
        )
        self.frontier.write(self.job_dir.frontier)
        if self.deadline_s is not None:
            point = self.frontier.choose(deadline_s=self.deadline_s)
        else:
            point = self.frontier.choose(max_slowdown=self.max_slowdown)
        chosen = self._plan_of(point.frequencies)
        self.adopt(chosen)
        self.report_profiling(chosen)
        self.phase = PerseusPhase.DEPLOYED
        logger.info(
            "Job %s: deployed plan T=%.4f s, E=%.1f J",
            self.job_info.job_id,
            chosen.iteration_time,
            chosen.energy,
        )
        self._update_overrides()

    def _plan_of(self, frequencies: list[list[int]]) -> Plan:
        from perseus.planning import make_plan

        assert self.profile is not None and self.p2p_power_w is not None
        return make_plan(
            self.profile,
            self.pipeline,
            frequencies,
            self.p2p_power_w,
            switch_latency_s=self.switch_latency_s,
        )

    def resume(self, plan: Plan) -> None:
        """Go straight to DEPLOYED with a persisted plan (restarted coordinator).

        The frontier is read back from ``frontier/`` when present, so straggler handling
        keeps working; otherwise stragglers are only logged.
        """
        self.adopt(plan)
        self.p2p_power_w = plan.p2p_power
        frontier_dir = self.job_dir.frontier
        if (frontier_dir / "frontier.csv").exists():
            from perseus.planning import Frontier

            self.frontier = Frontier.read(frontier_dir)
        profile_csv = self.job_dir.profile
        if self.profile is None and profile_csv.exists():
            self.profile = load_profile(profile_csv)
        self.sweep = None
        self.phase = PerseusPhase.DEPLOYED
        self._update_overrides()

    # ------------------------------------------------------------------ stragglers
    def on_straggler(self, dp_rank: int, slowdown: float) -> None:
        """Announce pipeline `dp_rank` runs `slowdown`× its normal time (1.0: recovered)."""
        if not 0 <= dp_rank < self.job_info.dp_degree:
            raise ConfigurationError(
                f"dp_rank {dp_rank} is out of range: job {self.job_info.job_id} has "
                f"dp_degree {self.job_info.dp_degree} (valid 0..{self.job_info.dp_degree - 1})"
            )
        if not (math.isfinite(slowdown) and slowdown >= 1.0):
            raise ConfigurationError(
                f"slowdown must be a finite number >= 1.0 (1.0 = recovered), got {slowdown!r}"
            )
        if slowdown == 1.0:
            self.announced.pop(dp_rank, None)
        else:
            self.announced[dp_rank] = slowdown
        logger.info(
            "Job %s: straggler announcement dp_rank=%d slowdown=%.3f",
            self.job_info.job_id,
            dp_rank,
            slowdown,
        )
        self._update_overrides()

    def stragglers(self) -> dict[int, float]:
        """Data-parallel rank → slowdown, announced or detected (announcements win)."""
        return {**self.detected, **self.announced}

    def _update_overrides(self) -> None:
        """Recompute the other pipelines' plan for the worst straggler."""
        self._overrides = {}
        self._running = {}
        if self.phase is not PerseusPhase.DEPLOYED or self.chosen is None:
            return
        stragglers = self.stragglers()
        if not stragglers or self.frontier is None:
            if stragglers:
                logger.warning(
                    "Job %s: straggler(s) %s but no frontier to slow the others down",
                    self.job_info.job_id,
                    stragglers,
                )
            return
        slowdown = max(stragglers.values())
        deadline = slowdown * self.chosen.iteration_time
        point = self.frontier.choose(deadline_s=deadline)
        plan = self._plan_of(point.frequencies)
        stage_plan = self.check_plan(plan)
        for dp in range(self.job_info.dp_degree):
            if dp not in stragglers:
                self._overrides[dp] = stage_plan
                self._running[dp] = plan
        logger.info(
            "Job %s: straggler(s) %s: other pipelines run T=%.4f s (≤ %.4f s), E=%.1f J",
            self.job_info.job_id,
            stragglers,
            plan.iteration_time,
            deadline,
            plan.energy,
        )

    def running_plan(self, dp_rank: int) -> Plan | None:
        """The plan pipeline `dp_rank` runs now."""
        return self._running.get(dp_rank, self.chosen)

    def _expected_busy_s(self, plan: Plan) -> list[float]:
        from perseus.planning import stage_busy_s

        assert self.profile is not None
        return stage_busy_s(self.profile, self.pipeline, plan.stage_frequencies())

    def _detect_stragglers(self, m: RoundMeasurement) -> None:
        if self.profile is None or self.job_info.dp_degree < 2:
            return
        ratio: dict[int, float] = {}
        expected: dict[int, list[float]] = {}
        for dp in range(self.job_info.dp_degree):
            plan = self.running_plan(dp)
            if plan is None:
                return
            key = id(plan)
            if key not in expected:
                expected[key] = self._expected_busy_s(plan)
            exp = expected[key]
            ratio[dp] = max(m.busy_s[dp, s] / exp[s] for s in range(self.num_stages) if exp[s] > 0)
        base = min(ratio.values())
        changed = False
        for dp, r in ratio.items():
            rel = r / base
            if rel > 1.0 + self.straggler_threshold:
                self._recover_streak[dp] = 0
                self._streak[dp] = self._streak.get(dp, 0) + 1
                known = self.detected.get(dp)
                if self._streak[dp] >= self.straggler_rounds and (
                    known is None or abs(rel - known) > self.straggler_threshold * known
                ):
                    self.detected[dp] = rel
                    changed = True
            else:
                self._streak[dp] = 0
                if dp in self.detected:
                    self._recover_streak[dp] = self._recover_streak.get(dp, 0) + 1
                    if self._recover_streak[dp] >= self.straggler_rounds:
                        del self.detected[dp]
                        changed = True
        if changed:
            logger.info("Job %s: detected stragglers %s", self.job_info.job_id, self.detected)
            self._update_overrides()
