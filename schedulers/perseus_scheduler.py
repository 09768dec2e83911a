"""`Perseus`: profile online, solve the time–energy frontier, deploy a plan, keep its promise."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perseus.domain.kinds import DEFAULT_P2P_POWER_W
from perseus.domain.plan import Plan
from perseus.errors import PlanError
from perseus.io.profile_csv import load_profile
from perseus.protocol import JobInfo, ProfilingResult, RankInfo, RoundStatus
from perseus.settings import PerseusSettings
from schedulers.args import SchedulerArgs
from schedulers.costs import CostModel, job_switch_latency
from schedulers.guard import GuardDecision, PromiseGuard, RoundFigures, median_figures
from schedulers.measurement import RoundMeasurement, StagePlan
from schedulers.perseus_args import PerseusArgs
from schedulers.perseus_phase import PerseusPhase
from schedulers.plan_model import PlanModel, check_frontier_fits
from schedulers.planning import PlanningScheduler
from schedulers.profiling_progress import ProfilingProgress
from schedulers.promise import Promise
from schedulers.solving import DeployStep, FrontierSolve
from schedulers.stragglers import StragglerTracker

if TYPE_CHECKING:
    from perseus.planning import Frontier

__all__ = ["DEFAULT_P2P_POWER_W", "Perseus", "PerseusArgs", "PerseusPhase"]


class Perseus(DeployStep, PlanningScheduler):
    """The whole Perseus loop online (phases: `PerseusPhase`).

    1. All-max rounds: the job's measured baseline (time, energy, their spread).
    2. Profile every instruction (`schedulers.sweep`), or read a profile (`profile_path`).
    3. Costs the profile does not hold (`schedulers.costs`): the clock-switch latency the
       ranks measured (`switch_latency_ms` overrides it) and the P2P hop latency calibrated
       from the all-max rounds (`hop_latency_ms` overrides it); both are in the frontier.
    4. Checks (`schedulers.checks`): a profile the timer could not resolve, or a plan whose
       saving the job could not tell from noise, keeps all-max, and says why.
    5. The frontier (`schedulers.plan_model`, written to the job's folder; a big one on a
       thread, `schedulers.solving`, all-max meanwhile); the minimum-energy point with
       T ≤ `deadline`, else T ≤ (1 + `max_slowdown`)·T(all-max).
    6. The guard (`schedulers.promise`): the deployed plan's measured rounds against the
       all-max ones; over budget, it moves to a faster point re-scored with the measured
       costs, then to all-max; saving nothing, to all-max. Every step is logged, sent to
       the job (rank 0 logs it), and written to ``promise.jsonl``.
    7. Stragglers (`schedulers.stragglers`): the other pipelines run the cheapest frontier
       point that still meets the straggler's time, and go back when it recovers.
    """

    Args = PerseusArgs

    @classmethod
    def check_job(cls, job_info: JobInfo, args: SchedulerArgs) -> None:
        """Also refuse, at registration, a job whose frontier would not fit in memory."""
        super().check_job(job_info, args)
        if not isinstance(args, PerseusArgs):
            raise TypeError(f"Perseus needs PerseusArgs, got {type(args).__name__}")
        check_frontier_fits(job_info, args)

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
        self.reference_every = args.reference_every
        self.promise = Promise(job_info.job_id, self.job_dir.promise, args, self._predicted)
        """The deployed plan's checked promise: all-max and plan rounds, guard, record."""
        self.model: PlanModel | None = None  # once profiling is complete (or resumed)
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
        self.progress = ProfilingProgress(
            1 + self.baseline_rounds if self.baseline_rounds else 0,
            windows=args.estimator == "windows",
            round_ticks=args.round_ticks,
        )
        self._round = -1
        self._issuing = False
        """Inside `plan_next`: a plan adopted now runs from the round being issued."""
        self._ran = "baseline"
        self._last_plan: StagePlan = []
        self._overrides: dict[int, StagePlan] = {}
        self._running: dict[int, Plan] = {}
        self._solve: FrontierSolve | None = None
        if self.sweep is None and not self.progress.lead_in:
            self._deploy()

    @property
    def guard(self) -> PromiseGuard:
        return self.promise.guard

    @property
    def baseline(self) -> list[RoundFigures]:
        """The measured all-max rounds."""
        return self.promise.baseline

    @property
    def costs(self) -> CostModel | None:
        return None if self.model is None else self.model.costs

    @property
    def frontier(self) -> Frontier | None:
        return None if self.model is None else self.model.frontier

    # ------------------------------------------------------------------ rounds
    def plan_next(self) -> StagePlan:
        self._round += 1
        if self.phase is PerseusPhase.PROFILING:
            if self._round < self.progress.lead_in:
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
            if self.phase is PerseusPhase.PROFILING:  # solving on its thread: all-max meanwhile
                self._ran = "baseline"
                return self.max_plan()
        if self._reference_due():
            self._ran = "baseline"
            return self.max_plan()
        self._ran = "other" if self._overrides else self.phase.value
        return self._deployed_plan()

    def _first_round_of_a_new_plan(self) -> int:
        """The round a plan adopted now runs first: the one being issued when it is adopted
        while issuing one (a deployment), else the next (a move after a measurement)."""
        return self._round if self._issuing else self._round + 1

    def round_steps(self) -> int | None:
        """Rounds long enough for the GPUs' energy counters: the sweep's energy windows, and
        every round measured against another (the all-max baseline and reference rounds,
        the deployed plan's rounds the guard compares with them: a round of one 0.5 s
        iteration on a counter that refreshes every 100 ms reads its energy within ±10 %)."""
        if not self.progress.windows:
            return None
        sweep = self.sweep if self.phase is PerseusPhase.PROFILING else None
        if sweep is not None and self._ran.startswith("sweep"):
            return sweep.round_steps()
        return self.progress.measured_round_steps([r.energy_refresh_s for r in self.rank_infos])

    def _sweep_left(self) -> bool:
        """Whether the sweep still has rounds to run. With a given profile the sweep only
        measures the blocking power, which the all-max baseline rounds measured already."""
        sweep = self.sweep
        if sweep is None or sweep.done or self._too_short():
            return False
        return not (self.profile is not None and sweep.p2p_samples)

    def _too_short(self) -> bool:
        """Whether the all-max rounds already showed instructions too short to plan clocks
        for (`ProfilingProgress.too_short`): then no clock is swept, the profile holds the
        max clock only, and `_deploy` keeps all-max saying why."""
        switch_s, _ = job_switch_latency(self.perseus_args.switch_latency_ms, self.rank_infos)
        return self.progress.too_short(switch_s)

    def _reference_due(self) -> bool:
        """Whether this round is one of the deployed plan's all-max reference rounds."""
        every = self.reference_every
        if not (self.promise.guarded and every and self.phase is PerseusPhase.DEPLOYED):
            return False
        return not self._overrides and (self._round - self.promise.plan_since) % every == every - 1

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
        self.progress.count(results, measurement.iteration_time_s)
        figures = RoundFigures(self._round, measurement.typical_time_s, measurement.job_energy_j)
        if issued == "baseline" and self.sweep is not None and not self.sweep.done:
            self.sweep.absorb(measurement)  # all-max windows: the blocking power, the top clock
            if self.phase is PerseusPhase.PROFILING and self._round > 0:
                self.progress.saw_all_max(measurement)
        if issued in ("baseline", "sweep-max") and self._round > 0:
            self.promise.add_baseline(figures)
            if issued == "baseline" and self.sweep is not None and measurement.p2p_power_w:
                self.sweep.p2p_samples.append(measurement.p2p_power_w)
        if self.phase is PerseusPhase.PROFILING:
            if issued == "sweep":
                freqs = [[f for _, f in rank] for rank in self._last_plan]
                self.progress.sweep_rounds.append((freqs, measurement.iteration_time_s))
                self.progress.add_sweep_round(figures, self.baseline)
            baseline_round = issued in ("baseline", "sweep-max")
            self.promise.note(
                self.progress.note(self._round, self.sweep, baseline_round=baseline_round)
            )
            return
        if issued == self.phase.value:
            self.promise.plan_rounds.append(figures)
            if self.phase is PerseusPhase.DEPLOYED and self.promise.guarded:
                decision = self.guard.observe(figures)
                if decision is not None:
                    self._on_guard(decision)
        if (
            self.phase is PerseusPhase.DEPLOYED
            and self.profile is not None
            and self.stragglers.detect(measurement, self.num_stages, self._expected_busy_s)
        ):
            self._update_overrides()

    # ------------------------------------------------------------------ solve & deploy
    def _scoring(self) -> PlanModel:
        """The plan model (`PlanError` before profiling is complete)."""
        if self.model is None:
            raise PlanError(f"Job {self.job_info.job_id}: nothing to score plans with yet")
        return self.model

    def _predicted(self, plan: Plan) -> tuple[float, float]:
        """(saving, slowdown) of `plan` against all-max, both scored by the same model."""
        return self._scoring().predicted(plan)

    def _run(self, plan: Plan, event: str, reason: str, *, costs: CostModel | None = None) -> None:
        """Deploy `plan` (a frontier point) and watch it."""
        self.adopt(plan)
        self.phase = PerseusPhase.DEPLOYED
        first = self._first_round_of_a_new_plan()
        self.promise.deployed(self._round, first, plan, event, reason, costs=costs)
        self._update_overrides()

    def _hold(self, event: str, problems: list[str]) -> None:
        """Run all-max from now on, saying why."""
        all_max = self._scoring().all_max()
        self.adopt(all_max)
        self.phase = PerseusPhase.ALL_MAX
        first = self._first_round_of_a_new_plan()
        self.promise.held(self._round, first, all_max, event, problems)
        self._update_overrides()

    def baseline_plan(self) -> Plan | None:
        """The all-max plan scored by the same model as the deployed plan."""
        if self.model is None or self.model.profile is None:
            return None
        return self.model.all_max()

    # ------------------------------------------------------------------ the guard
    def _on_guard(self, decision: GuardDecision) -> None:
        move, reason = self.promise.verdict(self._round, decision, self._faster_plan)
        if move is not None and reason is not None:
            self._run(move, "move", reason)
        elif reason is not None:
            self._hold("fallback", [reason])

    def _faster_plan(self, decision: GuardDecision) -> Plan | None:
        """The cheapest faster frontier point that meets the budget with the hop latency
        re-calibrated on the measured plan (`PlanModel.faster`)."""
        if self.chosen is None or self.model is None:
            return None  # nothing deployed from a frontier: all-max is the way back
        t_base = median_figures(self.baseline)[0]
        return self.model.faster(
            self.chosen,
            measured_time_s=(1.0 + decision.measured_slowdown) * t_base,
            limit_s=(1.0 + self.guard.budget) * t_base,
        )

    # ------------------------------------------------------------------ reporting
    def promise_events(self) -> list[dict[str, Any]]:
        return self.promise.story.take_events()

    def summary(self) -> str:
        """The job's measured figures so far, one line."""
        text = self.progress.totals()
        if self.phase is PerseusPhase.PROFILING:
            return text
        return self.promise.summary(text, held=self.phase is PerseusPhase.ALL_MAX)

    def status(self) -> RoundStatus:
        notes = self.promise.story.take_notes()
        estimate = None
        if self.phase is PerseusPhase.PROFILING:
            estimate = self._round + 1 + self.progress.rounds_left(self._round, self.sweep)
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
        if self.profile is None and self.job_dir.profile.exists():
            self.profile = load_profile(self.job_dir.profile)
        self.model = PlanModel.of_plan(
            self.job_info.job_id, self.pipeline, self.profile, plan, self.job_dir.frontier
        )
        self.sweep = None
        self.promise.guarded = False
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
        running = self.stragglers.others_plan(self.model, self.chosen)
        if running:
            stage_plan = self.check_plan(next(iter(running.values())))
            self._overrides = dict.fromkeys(running, stage_plan)
        self._running = running

    def running_plan(self, dp_rank: int) -> Plan | None:
        """The plan pipeline `dp_rank` runs now."""
        return self._running.get(dp_rank, self.chosen)

    def _expected_busy_s(self, dp: int) -> list[float] | None:
        plan = self.running_plan(dp)
        return None if plan is None or self.model is None else self.model.stage_busy_s(plan)
