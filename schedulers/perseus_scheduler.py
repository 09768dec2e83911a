"""`Perseus`: profile online, solve the time–energy frontier, deploy a plan, keep its promise."""

from __future__ import annotations

import enum
import logging
import math
from typing import Any

from pydantic import Field, field_validator

from perseus.domain.plan import Plan
from perseus.domain.profile import InstructionProfile
from perseus.domain.rows import ProfileRow
from perseus.domain.units import max_slowdown_problem
from perseus.errors import PlanError
from perseus.io.profile_csv import load_profile
from perseus.protocol import JobInfo, ProfilingResult, RankInfo, RoundStatus
from perseus.settings import PerseusSettings
from schedulers.args import SchedulerArgs
from schedulers.checks import plan_problems, profile_problems, short_instructions
from schedulers.costs import (
    CostModel,
    calibrate_costs,
    measured_switch_latency_s,
    rescore_faster,
)
from schedulers.guard import GuardDecision, PromiseGuard, RoundFigures, median_figures
from schedulers.pipeline import RoundMeasurement, StagePlan
from schedulers.planning import DEFAULT_P2P_POWER_W, PlanningArgs, PlanningScheduler
from schedulers.story import JobStory
from schedulers.stragglers import StragglerTracker
from schedulers.sweep import counter_round_steps

__all__ = ["DEFAULT_P2P_POWER_W", "Perseus", "PerseusArgs", "PerseusPhase"]

logger = logging.getLogger(__name__)


class PerseusPhase(enum.Enum):
    """PROFILING → DEPLOYED → ALL_MAX (or PROFILING → ALL_MAX).

    PROFILING: a warm-up round and `baseline_rounds` all-max rounds (the reference every
    measured saving and slowdown is taken against), then the instruction sweep (only the
    blocking power's all-max round when `profile_path` is given, nothing more when
    `p2p_power` is given too). At the end of the round that completes it, the costs are
    calibrated, the profile checked, the frontier solved and the chosen plan checked.
    DEPLOYED: every round runs the chosen plan, watched by the `PromiseGuard`; while a
    data-parallel pipeline straggles, the others run a slower, cheaper plan.
    ALL_MAX (terminal): every round runs all-max, because the profile or the plan failed a
    check, or because the guard measured the plan breaking its promise.
    """

    PROFILING = "profiling"
    DEPLOYED = "deployed"
    ALL_MAX = "all-max"


class PerseusArgs(PlanningArgs):
    """`Perseus`'s arguments: planning, the choice of a frontier point, its guard, stragglers."""

    max_slowdown: float = Field(
        default=0.0, ge=0.0, description="allowed slowdown vs all-max, a fraction (0.05 = 5 %)"
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
    switch_latency_ms: float | None = Field(
        default=None,
        ge=0.0,
        le=10_000.0,
        description="override: the time a clock change takes to apply, ms (default: the "
        "slowest one the job's ranks measured on their GPUs)",
    )
    hop_latency_ms: float | None = Field(
        default=None,
        ge=0.0,
        le=10_000.0,
        description="override: time added to every P2P hop between pipeline ranks, ms "
        "(default: calibrated from the job's all-max rounds)",
    )
    baseline_rounds: int = Field(
        default=4,
        ge=0,
        le=1000,
        description="all-max rounds measured before profiling: the reference of every measured "
        "saving and slowdown (0: none, and no guard)",
    )
    guard: bool = Field(
        default=True,
        description="compare the deployed plan's measured rounds with the all-max ones and "
        "move to a faster plan or back to all-max when it breaks its budget or saves nothing "
        "(off: also no check that the predicted saving stands out of the all-max rounds' spread)",
    )
    guard_window: int = Field(
        default=4, ge=2, le=1000, description="deployed rounds per guard check"
    )
    reference_every: int = Field(
        default=10,
        ge=0,
        le=10_000,
        description="while a plan runs, every reference_every-th round runs all-max, so the "
        "guard compares the plan with all-max measured at the same time (machines drift: "
        "temperature, other jobs); it costs that share of the saving. 0: only the all-max "
        "rounds before profiling",
    )
    guard_z: float = Field(
        default=3.0,
        gt=0.0,
        le=10.0,
        description="standard errors (of the all-max rounds' spread) that make a measured "
        "difference real",
    )

    @field_validator("max_slowdown")
    @classmethod
    def _slowdown_is_a_fraction(cls, value: float) -> float:
        problem = max_slowdown_problem(value)
        if problem:
            raise ValueError(problem)
        return value


def _pct(x: float) -> str:
    return f"{x:+.2%}"


class Perseus(PlanningScheduler):
    """The whole Perseus loop online (phases: `PerseusPhase`).

    1. All-max rounds: the job's measured baseline (time, energy, their spread).
    2. Profile every instruction (`schedulers.sweep`), or read a profile (`profile_path`).
    3. Costs the profile does not hold (`schedulers.costs`): the clock-switch latency the
       ranks measured (`switch_latency_ms` overrides it) and the P2P hop latency calibrated
       from the all-max rounds (`hop_latency_ms` overrides it); both are in the frontier.
    4. Checks (`schedulers.checks`): a profile the timer could not resolve, or a plan whose
       saving the job could not tell from noise, keeps all-max, and says why.
    5. The frontier (`perseus.planning.solve_frontier`, written to the job's folder); the
       minimum-energy point with T ≤ `deadline`, else T ≤ (1 + `max_slowdown`)·T(all-max).
    6. The guard (`schedulers.guard`): the deployed plan's measured rounds against the
       all-max ones; over budget, it moves to a faster point re-scored with the measured
       costs, then to all-max; saving nothing, to all-max. Every step is logged, sent to
       the job (rank 0 logs it), and written to ``promise.jsonl``.
    7. Stragglers (`schedulers.stragglers`): the other pipelines run the cheapest frontier
       point that still meets the straggler's time, and go back when it recovers.
    """

    Args = PerseusArgs

    @classmethod
    def check_job(cls, job_info: JobInfo, args: SchedulerArgs) -> None:
        """Also refuse, at registration, a job whose frontier would not fit in memory
        (counted from its orders or the default schedule's shape, without building it)."""
        super().check_job(job_info, args)
        from perseus.domain.schedule import instructions_per_stage
        from perseus.planning import check_frontier_memory

        if not isinstance(args, PerseusArgs):
            raise TypeError(f"Perseus needs PerseusArgs, got {type(args).__name__}")
        if job_info.pipeline is not None:
            name = job_info.pipeline.schedule
            count = sum(len(order) for order in job_info.pipeline.orders)
        else:
            name = args.schedule
            count = job_info.pp_degree * instructions_per_stage(
                args.schedule, args.num_microbatches or 1, args.num_chunks
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

        self.perseus_args = args

        # Now, not after the profiling sweep: a job too big to solve fails at registration.
        check_frontier_memory(self.pipeline.num_instructions, self.pipeline.name)
        self.max_slowdown = args.max_slowdown
        self.deadline_s = args.deadline
        self.baseline_rounds = args.baseline_rounds
        self._estimator = args.estimator
        self._round_ticks = args.round_ticks
        self._last_iteration_s: float | None = None
        self._baseline_times: list[float] = []
        self._baseline_round: RoundMeasurement | None = None
        """The instruction times (per stage and kind) of the last all-max profiling round."""
        self.reference_every = args.reference_every
        self.guarded = args.guard and args.baseline_rounds > 0
        self.guard = PromiseGuard(
            budget=args.max_slowdown,
            window=args.guard_window,
            z=args.guard_z,
            baseline_window=max(4, args.baseline_rounds + 1),
        )
        self.stragglers = StragglerTracker(
            job_info.job_id,
            job_info.dp_degree,
            threshold=args.straggler_threshold,
            rounds=args.straggler_rounds,
        )
        # With all-max rounds first, the sweep needs no warm-up of its own.
        sweep_args = args.model_copy(update={"warmup_rounds": 0}) if self.baseline_rounds else args
        self.init_profile_source(sweep_args)
        self.phase = PerseusPhase.PROFILING
        self.frontier = None
        self.costs: CostModel | None = None
        self.baseline: list[RoundFigures] = []
        self._lead_in = 1 + self.baseline_rounds if self.baseline_rounds else 0
        """All-max rounds issued before the sweep (the first is a warm-up, not measured)."""
        self._round = -1
        self._issuing = False
        """Inside `plan_next`: a plan adopted now runs from the round being issued."""
        self._ran = "baseline"
        self._last_plan: StagePlan = []
        self._round_iterations = 0
        self._sweep_rounds: list[tuple[list[list[int]], float]] = []
        self._plan_rounds: list[RoundFigures] = []
        self._plan_since = 0
        self._overrides: dict[int, StagePlan] = {}
        self._running: dict[int, Plan] = {}
        self.story = JobStory(job_info.job_id, self.job_dir.promise)
        self._energy_j = 0.0
        self._iterations = 0
        self._profiling_cost = (0.0, 0.0)
        if self.sweep is None and not self._lead_in:
            self._deploy()

    # ------------------------------------------------------------------ rounds
    def plan_next(self) -> StagePlan:
        self._round += 1
        if self.phase is PerseusPhase.PROFILING:
            if self._round < self._lead_in:
                self._ran = "baseline"
                return self.max_plan()
            if self._sweep_left():
                plan = self.sweep.current_plan()
                self._ran = "sweep-max" if plan == self.max_plan() else "sweep"
                self._last_plan = plan
                return plan
            self._issuing = True
            try:
                self._deploy()
            finally:
                self._issuing = False
        if self._reference_due():
            self._ran = "baseline"
            return self.max_plan()
        self._ran = "other" if self._overrides else self.phase.value
        if self._chosen_plan is None:
            raise RuntimeError("Perseus has no plan to run")  # _deploy always adopts one
        return self._chosen_plan

    def _first_round_of_a_new_plan(self) -> int:
        """The round a plan adopted now runs first: the one being issued when it is adopted
        while issuing one (a deployment), else the next (a move after a measurement)."""
        return self._round if self._issuing else self._round + 1

    def round_steps(self) -> int | None:
        """Rounds long enough for the GPUs' energy counters: the sweep's energy windows, and
        every round measured against another (the all-max baseline and reference rounds,
        the deployed plan's rounds the guard compares with them: a round of one 0.5 s
        iteration on a counter that refreshes every 100 ms reads its energy within ±10 %)."""
        if self._estimator != "windows":
            return None
        if (
            self.phase is PerseusPhase.PROFILING
            and self._ran.startswith("sweep")
            and self.sweep is not None
        ):
            return self.sweep.round_steps()
        refresh = [r.energy_refresh_s for r in self.rank_infos]
        return counter_round_steps(refresh, self._last_iteration_s, self._round_ticks)

    def _sweep_left(self) -> bool:
        """Whether the sweep still has rounds to run. With a given profile the sweep only
        measures the blocking power, which the all-max baseline rounds measured already."""
        sweep = self.sweep
        if sweep is None or sweep.done or self._too_short():
            return False
        return not (self.profile is not None and sweep.p2p_samples)

    def _too_short(self) -> bool:
        """Whether the all-max rounds already showed instructions too short to plan clocks
        for (`schedulers.checks.short_instructions`): then no clock is swept, the profile
        holds the max clock only, and `_deploy` keeps all-max saying why."""
        if not self._baseline_times:
            return False
        switch = self.perseus_args.switch_latency_ms
        switch_s = (
            switch / 1000.0
            if switch is not None
            else measured_switch_latency_s(self.rank_infos) or 0.0
        )
        return short_instructions(self._baseline_times, switch_latency_s=switch_s) is not None

    def _max_clock_profile(self, m: RoundMeasurement) -> InstructionProfile:
        """The profile an all-max round gives: every (stage, kind) at the max clock only."""
        rows = [
            ProfileRow(
                rank=vs.rank,
                dp_rank=0,
                pp_rank=vs.rank,
                tp_rank=0,
                stage=stage,
                instruction=kind,
                frequency=self.max_freq_mhz,
                time=vs.time_s[kind],
                energy=vs.energy_j.get(kind, 0.0),
                emulated=any(r.emulated for r in self.rank_infos),
            )
            for stage, vs in enumerate(m.virtual_stages)
            for kind in vs.time_s
        ]
        return InstructionProfile.from_rows(
            rows, source=f"job {self.job_info.job_id} (all-max rounds)", check_power=False
        )

    def _reference_due(self) -> bool:
        """Whether this round is one of the deployed plan's all-max reference rounds."""
        every = self.reference_every
        if not (self.guarded and every and self.phase is PerseusPhase.DEPLOYED):
            return False
        return not self._overrides and (self._round - self._plan_since) % every == every - 1

    def pipeline_overrides(self) -> dict[int, StagePlan]:
        return {} if self._ran == "baseline" else self._overrides

    def on_measurement(
        self, measurement: RoundMeasurement | None, results: list[ProfilingResult]
    ) -> None:
        issued = self._ran
        if issued.startswith("sweep") and self.sweep is not None:
            self.sweep.observe(measurement)
        if measurement is None:
            return
        self._count(results)
        figures = RoundFigures(self._round, measurement.iteration_time_s, measurement.job_energy_j)
        self._last_iteration_s = measurement.iteration_time_s
        if issued == "baseline" and self.sweep is not None and not self.sweep.done:
            self.sweep.absorb(measurement)  # all-max windows: the blocking power, the top clock
            if self.phase is PerseusPhase.PROFILING and self._round > 0:
                self._baseline_round = measurement
                self._baseline_times = [
                    t for stage in measurement.virtual_stages for t in stage.time_s.values()
                ]
        if issued in ("baseline", "sweep-max") and self._round > 0:
            self.baseline.append(figures)
            self.guard.add_baseline(figures)
            if issued == "baseline" and self.sweep is not None and measurement.p2p_power_w:
                self.sweep.p2p_samples.append(measurement.p2p_power_w)
        if self.phase is PerseusPhase.PROFILING:
            if issued == "sweep":
                freqs = [[f for _, f in rank] for rank in self._last_plan]
                self._sweep_rounds.append((freqs, measurement.iteration_time_s))
            self._profiling_progress(figures, issued)
            return
        if issued == self.phase.value:
            self._plan_rounds.append(figures)
            if self.phase is PerseusPhase.DEPLOYED and self.guarded:
                decision = self.guard.observe(figures)
                if decision is not None:
                    self._on_guard(decision)
        if (
            self.phase is PerseusPhase.DEPLOYED
            and self.profile is not None
            and self.stragglers.detect(measurement, self.num_stages, self._expected_busy_s)
        ):
            self._update_overrides()

    def _count(self, results: list[ProfilingResult]) -> None:
        """The job's measured joules and iterations so far (every GPU)."""
        self._round_iterations = max((len(r.iter_time) for r in results), default=0)
        self._energy_j += math.fsum(math.fsum(r.iter_energy) for r in results)
        self._iterations += self._round_iterations

    # ------------------------------------------------------------------ profiling
    def _rounds_left(self) -> int:
        """About how many profiling rounds are still to come."""
        left = max(0, self._lead_in - self._round - 1)
        sweep = self.sweep
        if sweep is not None and not sweep.done:
            left += sweep.rounds_left_estimate()
        return left

    def _profiling_progress(self, figures: RoundFigures, issued: str) -> None:
        if issued == "sweep" and self.baseline:
            t0, e0 = median_figures(self.baseline)
            n = max(1, self._round_iterations)
            dt, de = self._profiling_cost
            self._profiling_cost = (
                dt + (figures.iteration_time_s - t0) * n,
                de + (figures.energy_j - e0) * n,
            )
        done = self._round + 1
        dt, de = self._profiling_cost
        what = "all-max baseline" if issued in ("baseline", "sweep-max") else "clock sweep"
        self._note(
            f"profiling round {done} of about {done + self._rounds_left()} ({what}); "
            f"the sweep has cost {dt:+.2f} s and {de:+.0f} J against all-max so far"
        )

    # ------------------------------------------------------------------ solve & deploy
    def _cost_model(self) -> CostModel:
        profile, p2p = self._inputs()
        args = self.perseus_args
        if args.switch_latency_ms is not None:
            switch, source = args.switch_latency_ms / 1000.0, "given"
        else:
            measured = measured_switch_latency_s(self.rank_infos)
            switch, source = (0.0, "unknown") if measured is None else (measured, "measured")
        base_t = median_figures(self.baseline)[0] if self.baseline else None
        return calibrate_costs(
            profile,
            self.pipeline,
            p2p,
            switch_latency_s=switch,
            switch_source=source,
            hop_latency_s=None if args.hop_latency_ms is None else args.hop_latency_ms / 1000.0,
            baseline_time_s=base_t,
            rounds=self._sweep_rounds,
        )

    def _deploy(self) -> None:
        from perseus.planning import solve_frontier

        if self.profile is None and self._baseline_round is not None and self._too_short():
            self.profile = self._max_clock_profile(self._baseline_round)
        self.complete_profile()
        profile, p2p = self._inputs()
        self.costs = costs = self._cost_model()
        self._note(f"cost model: {costs.describe()}")
        if costs.switch_source == "unknown":
            self._note(
                "no rank could time a clock switch on its GPU: planning as if changes were "
                "free (set switch_latency_ms to override)",
                warning=True,
            )
        problems = profile_problems(profile, switch_latency_s=costs.switch_latency_s)
        if problems:
            self.report_profiling(None)
            self._hold("held", problems)
            return
        logger.info(
            "Job %s: solving the frontier (%d stages × %d microbatches, P_block %.1f W)",
            self.job_info.job_id,
            self.num_stages,
            self.pipeline.num_microbatches,
            p2p,
        )
        self.frontier = solve_frontier(
            profile,
            self.pipeline,
            p2p_power_w=p2p,
            switch_latency_s=costs.switch_latency_s,
            hop_latency_s=costs.hop_latency_s,
        )
        self.frontier.write(self.job_dir.frontier)
        if self.deadline_s is not None:
            point = self.frontier.choose(deadline_s=self.deadline_s)
        else:
            point = self.frontier.choose(max_slowdown=self.max_slowdown)
        chosen = self._plan_of(point.frequencies)
        self.report_profiling(chosen)
        saving, slowdown = self._predicted(chosen)
        problems = plan_problems(
            predicted_saving=saving,
            predicted_slowdown=slowdown,
            # Whether the job can tell the saving from noise matters to the guard, which
            # measures it; with the guard off nothing is measured against all-max.
            baseline_energies_j=[r.energy_j for r in self.baseline] if self.guarded else [],
        )
        if problems:
            self._hold("held", problems)
            return
        all_max_t = self._all_max_plan().iteration_time
        if self.deadline_s is not None:
            self.guard.budget = max(0.0, self.deadline_s / all_max_t - 1.0)
        self._run(chosen, "deployed", f"budget {self.guard.budget:.2%}", costs=costs)

    def _inputs(self) -> tuple[InstructionProfile, float]:
        """The profile and the blocking power (set once profiling is complete)."""
        if self.profile is None or self.p2p_power_w is None:
            raise PlanError(
                f"Job {self.job_info.job_id}: no profile or blocking power yet to plan with"
            )
        return self.profile, self.p2p_power_w

    def _predicted(self, plan: Plan) -> tuple[float, float]:
        """(saving, slowdown) of `plan` against all-max, both scored by the same model."""
        base = self._all_max_plan()
        return 1.0 - plan.energy / base.energy, plan.iteration_time / base.iteration_time - 1.0

    def _run(self, plan: Plan, event: str, reason: str, *, costs: CostModel | None = None) -> None:
        """Deploy `plan` (a frontier point) and watch it."""
        self.adopt(plan)
        self.phase = PerseusPhase.DEPLOYED
        self._plan_rounds, self._plan_since = [], self._first_round_of_a_new_plan()
        saving, slowdown = self._predicted(plan)
        if self.guarded:
            self.guard.watch(slowdown)
        text = (
            f"{'deployed' if event == 'deployed' else 'moved to'} a plan predicted to save "
            f"{saving:.2%} at {_pct(slowdown)} slowdown ({reason})"
        )
        if self.guarded and event == "deployed":
            text += (
                f"; checked against the {len(self.baseline)} all-max rounds over the next "
                f"{1 + self.guard.window} rounds"
            )
        model = {}
        if costs is not None:
            model = {
                "switch_latency_s": costs.switch_latency_s,
                "hop_latency_s": costs.hop_latency_s,
                "model_residual": costs.residual,
            }
        self._record(event, reason, plan=plan, warning=event != "deployed", text=text, **model)
        self._update_overrides()

    def _hold(self, event: str, problems: list[str]) -> None:
        """Run all-max from now on, saying why."""
        self.adopt(self._all_max_plan())
        self.phase = PerseusPhase.ALL_MAX
        self._plan_rounds, self._plan_since = [], self._first_round_of_a_new_plan()
        self.guard.hold()
        reason = "; ".join(problems)
        self._record(event, reason, plan=self.chosen, warning=True, text=f"all-max stays: {reason}")
        self._update_overrides()

    def _plan_of(self, frequencies: list[list[int]], *, hop_latency_s: float | None = None) -> Plan:
        from perseus.planning import make_plan

        profile, p2p = self._inputs()
        costs = self.costs
        return make_plan(
            profile,
            self.pipeline,
            frequencies,
            p2p,
            switch_latency_s=costs.switch_latency_s if costs else 0.0,
            hop_latency_s=(costs.hop_latency_s if costs else 0.0)
            if hop_latency_s is None
            else hop_latency_s,
        )

    def _all_max_plan(self) -> Plan:
        from perseus.planning import max_frequencies

        profile, _ = self._inputs()
        return self._plan_of(max_frequencies(profile, self.pipeline))

    def baseline_plan(self) -> Plan | None:
        """The all-max plan scored by the same model as the deployed plan."""
        if self.profile is None or self.p2p_power_w is None or self.costs is None:
            return None
        return self._all_max_plan()

    # ------------------------------------------------------------------ the guard
    def _on_guard(self, decision: GuardDecision) -> None:
        figures = {
            "measured_slowdown": decision.measured_slowdown,
            "measured_saving": decision.measured_saving,
            "slowdown_tolerance": decision.slowdown_tolerance,
            "saving_tolerance": decision.saving_tolerance,
            "rounds": list(decision.rounds),
        }
        if decision.move is None:
            # The first verdict on a plan is news for the job's log; later ones only when
            # they are not "still keeps" (they stay in promise.jsonl and /jobs either way).
            quiet = decision.reason.startswith("still keeps")
            text = None if quiet else f"guard: {decision.reason}"
            self._record("check", decision.reason, text=text, **figures)
            return
        if decision.move == "faster":
            faster = self._faster_plan(decision)
            if faster is not None:
                self._record("check", decision.reason, warning=True, text=None, **figures)
                self._run(
                    faster, "move", f"guard: {decision.reason}; re-scored with the measured costs"
                )
                return
            reason = decision.reason + "; no faster plan meets the budget with the measured costs"
        else:
            reason = decision.reason
        self._record("check", reason, text=None, **figures)
        self._hold("fallback", [f"guard: {reason}"])

    def _faster_plan(self, decision: GuardDecision) -> Plan | None:
        """The cheapest faster frontier point that meets the budget with the hop latency
        re-calibrated on the measured plan (`schedulers.costs.rescore_faster`)."""
        profile, p2p = self._inputs()
        if self.chosen is None or self.frontier is None or self.costs is None:
            return None  # nothing deployed from a frontier: all-max is the way back
        t_base = median_figures(self.baseline)[0]
        plan, self.costs = rescore_faster(
            profile,
            self.pipeline,
            p2p,
            self.costs,
            chosen=self.chosen,
            candidates=[p.frequencies for p in self.frontier.points],
            measured_time_s=(1.0 + decision.measured_slowdown) * t_base,
            limit_s=(1.0 + self.guard.budget) * t_base,
        )
        return plan

    # ------------------------------------------------------------------ reporting
    def _note(self, text: str, *, warning: bool = False) -> None:
        self.story.note(text, warning=warning)

    def _record(
        self,
        event: str,
        reason: str,
        *,
        plan: Plan | None = None,
        warning: bool = False,
        text: str | None,
        **extra: Any,
    ) -> None:
        entry: dict[str, Any] = {"round": self._round, "event": event, "reason": reason, **extra}
        if plan is not None:
            saving, slowdown = self._predicted(plan)
            entry |= {
                "predicted_saving": saving,
                "predicted_slowdown": slowdown,
                "iteration_time_s": plan.iteration_time,
                "energy_j": plan.energy,
            }
        self.story.record(entry)
        if text is not None:
            self._note(text, warning=warning)

    def promise_events(self) -> list[dict[str, Any]]:
        return self.story.take_events()

    def summary(self) -> str:
        """The job's measured figures so far, one line."""
        text = f"{self._energy_j:,.0f} J in {self._iterations} iteration(s), all GPUs"
        if not self.baseline or not self._plan_rounds or self.phase is PerseusPhase.PROFILING:
            return text
        t0, e0 = median_figures(self.baseline)
        t1, e1 = median_figures(self._plan_rounds)
        what = "all-max (held)" if self.phase is PerseusPhase.ALL_MAX else "the plan"
        return (
            f"measured saving {1 - e1 / e0:.2%} at {_pct(t1 / t0 - 1)} slowdown (medians of "
            f"{len(self._plan_rounds)} round(s) of {what} since round {self._plan_since} vs "
            f"{len(self.baseline)} all-max round(s)); {text}"
        )

    def status(self) -> RoundStatus:
        notes = self.story.take_notes()
        estimate = None
        if self.phase is PerseusPhase.PROFILING:
            estimate = self._round + 1 + self._rounds_left()
        return RoundStatus(
            phase=self.phase.value,
            round=max(0, self._round),
            profiling_rounds=estimate,
            notes=notes,
            summary=self.summary(),
        )

    def resume(self, plan: Plan) -> None:
        """Go straight to DEPLOYED with a persisted plan (restarted coordinator).

        The frontier is read back from ``frontier/`` when present, so straggler handling
        keeps working; otherwise stragglers are only logged. The all-max rounds measured
        before the restart are not kept, so the guard does not watch a resumed plan.
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
        self.costs = CostModel(
            switch_latency_s=plan.switch_latency,
            switch_source="from the plan",
            hop_latency_s=plan.hop_latency,
            hop_source="from the plan",
        )
        self.sweep = None
        self.guarded = False
        self.phase = PerseusPhase.DEPLOYED
        self._round = max(self._round, 0)
        self._update_overrides()

    # ------------------------------------------------------------------ stragglers
    def on_straggler(self, dp_rank: int, slowdown: float) -> None:
        """Announce pipeline `dp_rank` runs `slowdown`× its normal time (1.0: recovered)."""
        self.stragglers.announce(dp_rank, slowdown)
        self._update_overrides()

    def _update_overrides(self) -> None:
        """Recompute the other pipelines' plan for the worst straggler."""
        self._overrides = {}
        self._running = {}
        if self.phase is not PerseusPhase.DEPLOYED or self.chosen is None:
            return
        stragglers = self.stragglers.stragglers()
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

    def _expected_busy_s(self, dp: int) -> list[float] | None:
        from perseus.planning import stage_busy_s

        plan = self.running_plan(dp)
        if plan is None or self.profile is None:
            return None
        return stage_busy_s(self.profile, self.pipeline, plan.stage_frequencies())
