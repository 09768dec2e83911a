"""`Perseus`: profile online, solve the time–energy frontier, deploy a plan, keep its promise."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import statistics
from typing import TYPE_CHECKING, Any

from perseus.domain.kinds import DEFAULT_P2P_POWER_W
from perseus.domain.plan import Plan
from perseus.domain.profile import InstructionProfile
from perseus.errors import PerseusError, PlanError
from perseus.io.profile_csv import load_profile
from perseus.protocol import JobInfo, ProfilingResult, RankInfo, RoundStatus
from perseus.schedulers.args import SchedulerArgs
from perseus.schedulers.base import RoundReport
from perseus.schedulers.measurement import RoundMeasurement, StagePlan
from perseus.schedulers.perseus_scheduler.args import PerseusArgs
from perseus.schedulers.perseus_scheduler.checks import profile_problems
from perseus.schedulers.perseus_scheduler.costs import CostModel, job_switch_latency
from perseus.schedulers.perseus_scheduler.drift import DriftWatch
from perseus.schedulers.perseus_scheduler.guard import (
    GuardDecision,
    GuardState,
    PromiseGuard,
    RoundFigures,
    median_figures,
)
from perseus.schedulers.perseus_scheduler.phase import PerseusPhase
from perseus.schedulers.perseus_scheduler.plan_model import PlanModel, check_frontier_fits
from perseus.schedulers.perseus_scheduler.profiling_progress import ProfilingProgress
from perseus.schedulers.perseus_scheduler.promise import Promise
from perseus.schedulers.perseus_scheduler.solve_pool import SolveFailedError
from perseus.schedulers.perseus_scheduler.solving import Deployer, FrontierSolve
from perseus.schedulers.perseus_scheduler.stage_clocks import (
    StageClockSweep,
    StageCurve,
    StageLimits,
    fit_stage_curves,
    fit_time_sensitivity,
    stage_levels,
    stage_profile,
)
from perseus.schedulers.perseus_scheduler.stragglers import StragglerTracker
from perseus.schedulers.planning import PlanningScheduler
from perseus.settings import PerseusSettings

if TYPE_CHECKING:
    from collections.abc import Sequence

    from perseus.planning import AfterWork, Frontier
    from perseus.schedulers.sweep.instruction_sweep import InstructionSweep

__all__ = ["DEFAULT_P2P_POWER_W", "Perseus", "PerseusArgs", "PerseusPhase"]

logger = logging.getLogger(__name__)

MAX_LEFT_OUT_LISTED = 64
"""Left-out profile rows a ``profile_left_out`` event lists (the count says how many)."""


class Perseus(PlanningScheduler):
    """The whole Perseus loop online (phases: `PerseusPhase`).

    1. All-max rounds: the job's measured baseline (time, energy, their spread).
    2. Profile every instruction (`perseus.schedulers.sweep.instruction_sweep`), or read a profile (`profile_path`).
    3. Costs the profile does not hold (`perseus.schedulers.perseus_scheduler.costs`): the clock-switch latency the
       ranks measured (`switch_latency_ms` overrides it) and the P2P hop latency calibrated
       from the all-max rounds (`hop_latency_ms` overrides it); both are in the frontier.
    4. Checks (`perseus.schedulers.perseus_scheduler.checks`): a profile the timer could not resolve, or a plan whose
       saving the job could not tell from noise, keeps all-max, and says why.
    5. The frontier (`perseus.schedulers.perseus_scheduler.plan_model`, written to the job's folder; a big one on a
       thread, `perseus.schedulers.perseus_scheduler.solving`, all-max meanwhile); the minimum-energy point with
       T ≤ `deadline`, else T ≤ (1 + `max_slowdown`)·T(all-max).
    6. The guard (`perseus.schedulers.perseus_scheduler.promise`): the deployed plan's measured rounds against the
       all-max ones; over budget, it moves to a faster point re-scored with the measured
       costs, then to all-max; saving nothing, to all-max, for a cool-down after which the
       plan is re-deployed (`perseus.schedulers.perseus_scheduler.guard`). Every step is logged, sent to the job
       (rank 0 logs it), and written to ``promise.jsonl``; the guard's state to
       ``guard.json``, so that a restarted coordinator goes on guarding (`resume`).
    7. Stragglers (`perseus.schedulers.perseus_scheduler.stragglers`): the other pipelines run the cheapest frontier
       point that still meets the straggler's time, and go back when it recovers.

    Instructions too short for per-instruction clocks (`perseus.schedulers.perseus_scheduler.checks.short_instructions`,
    seen in the all-max rounds) are not swept: the stages' clocks are
    (`perseus.schedulers.perseus_scheduler.stage_clocks`), and the plans run every instruction of a stage at one clock,
    then are checked, deployed and guarded as above.
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
        self.promise = Promise(
            job_info.job_id,
            self.job_dir.promise,
            args,
            self._predicted,
            # Only a coordinator that dumps its state resumes jobs (and reads guard.json).
            state_path=self.job_dir.guard if perseus_settings.dump_data else None,
        )
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
        self._sweep_args = sweep_args
        self.init_profile_source(sweep_args)
        self.drift = DriftWatch(args.reprofile_drift)
        """The all-max reference rounds against those the profile was taken with."""
        self._profiled_from = 0
        """The round the current profile's rounds began (a re-profile's first)."""
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
        self.deployer = Deployer(self.job_dir.frontier, name=f"perseus-solve-{job_info.job_id}")
        """From a complete profile to the plan to deploy: the frontier's solve, its back-off
        after a failure, the point's choice and checks (`_deploy`)."""
        self.stage_sweep: StageClockSweep | None = None
        """The per-stage clock rounds, once the all-max rounds showed instructions too short."""
        self.stage_curves: list[StageCurve] | None = None
        """Per stage, its fitted clocks (a per-stage plan's profile), once fitted."""
        self._all_max_rounds: list[RoundMeasurement] = []
        """The all-max profiling rounds (not the warm-up): the max clock's stage figures."""
        self.stage_sensitivity: tuple[float, ...] | None = None
        """Per stage, the share of its added busy time the per-stage rounds' iterations
        grew by (`perseus.schedulers.perseus_scheduler.stage_clocks.fit_time_sensitivity`), once fitted."""
        if self.sweep is None and not self.progress.lead_in:
            self._deploy()

    @property
    def guard(self) -> PromiseGuard:
        return self.promise.guard

    @property
    def baseline(self) -> Sequence[RoundFigures]:
        """The newest measured all-max rounds (the guard's bounded window)."""
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
        if self.phase is PerseusPhase.ALL_MAX and self.deployer.retry_due(self._round):
            self.phase = PerseusPhase.PROFILING  # the profile is complete: `_deploy` solves
            self.promise.note(f"round {self._round}: solving the frontier again")
        if self.phase is PerseusPhase.PROFILING:
            if self._round < self.progress.lead_in:
                self._ran = "baseline"
                return self.max_plan()
            if self._sweep_left():
                plan = self.sweep.current_plan()
                self._ran = "sweep-max" if plan == self.max_plan() else "sweep"
                self._last_plan = plan
                return plan
            if self._stage_sweep_left():
                assert self.stage_sweep is not None
                plan = self.uniform_plan(self.stage_sweep.current_freqs())
                self._ran = "stage-sweep"
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

    def _stage_sweep_left(self) -> bool:
        """Whether per-stage clock rounds are still to run: the all-max rounds showed
        instructions too short to plan one by one, and the GPUs offer clocks to try (the
        sweep starts at the first call that finds so)."""
        if self.profile is not None or self.sweep is None or not self._too_short():
            return False
        if self.stage_sweep is None:
            levels = stage_levels(self.frequencies)
            if len(levels) < 2 or not self._all_max_rounds:
                return False  # nothing to try: `_deploy` holds all-max, saying why
            self.stage_sweep = StageClockSweep(self.pipeline, levels)
            for m in self._all_max_rounds:
                self.stage_sweep.add_all_max(m)
            self.promise.note(
                f"{self._per_stage_why()}; measuring {len(levels)} clocks per stage "
                f"({levels[0]}..{levels[-1]} MHz) over {len(self.stage_sweep.rounds)} rounds"
            )
        return not self.stage_sweep.done

    def _per_stage_why(self) -> str:
        """Why the job's plans are per stage (for its log and its promise record)."""
        m = self.progress.all_max_round
        times = [] if m is None else [t for s in m.virtual_stages for t in s.time_s.values()]
        median_ms = 1000 * statistics.median(times) if times else math.nan
        return (
            f"instructions of {median_ms:.2f} ms (median at the max clock) are too short for "
            "per-instruction clocks; per-stage constant clocks instead"
        )

    def _per_stage_profile(self) -> InstructionProfile:
        """The profile of a job whose instructions are too short: scaled per stage from the
        per-stage clock rounds (`perseus.schedulers.perseus_scheduler.stage_clocks`), or the max clock only when there
        were none (its plan is all-max; `_deploy` holds it, saying why)."""
        job_id = self.job_info.job_id
        sweep = self.stage_sweep
        if sweep is None or not sweep.done or not self._all_max_rounds:
            return self.progress.max_clock_profile(job_id, self.max_freq_mhz, self.rank_infos)
        if self.p2p_power_w is None:  # as `complete_profile` measures it, once for both
            measured = self.sweep.p2p_power_w() if self.sweep is not None else None
            self.p2p_power_w = (
                DEFAULT_P2P_POWER_W if measured is None else measured
            ) * self.job_info.tp_degree
        first_dp = min(r.dp_rank for r in self.rank_infos)
        members = [[r for r in rs if r.dp_rank == first_dp] for rs in self.stage_ranks]

        def total(values: list[float | None]) -> float | None:
            known = [v for v in values if v is not None]
            return math.fsum(known) if len(known) == len(values) else None

        self.stage_curves = curves = fit_stage_curves(
            sweep.samples,
            sweep.levels,
            p2p_power_w=self.p2p_power_w,
            power_floor_w=[total([r.idle_power_w for r in rs]) for rs in members],
            power_cap_w=[total([r.power_limit_w for r in rs]) for rs in members],
        )
        max_times: dict[tuple[int, str], list[float]] = {}
        for m in self._all_max_rounds:
            for stage, vs in enumerate(m.virtual_stages):
                for kind, t in vs.time_s.items():
                    max_times.setdefault((stage, kind), []).append(t)
        firsts = [min(rs, key=lambda r: r.tp_rank) for rs in members]
        profile = stage_profile(
            {key: statistics.fmean(ts) for key, ts in max_times.items()},
            curves,
            self.pipeline,
            ranks=[(r.rank, r.dp_rank, r.pp_rank, r.tp_rank) for r in firsts],
            emulated=any(r.emulated for r in self.rank_infos),
            source=f"job {job_id} (per-stage clock rounds)",
        )
        for c in curves:
            logger.info("Job %s: per-stage clocks, %s", job_id, c.describe())
            if c.left_out:
                self.promise.note(
                    f"stage {c.stage}: clocks left out of the per-stage plans: "
                    + "; ".join(c.left_out),
                    warning=True,
                )
        return profile

    def _stage_limits(self) -> StageLimits:
        """What the per-stage plans aim at: the job's time limit, and each stage's share of
        its added busy time the per-stage rounds' iterations grew by (`fit_time_sensitivity`)."""
        sensitivity = None
        if self.stage_sweep is not None:
            sensitivity = fit_time_sensitivity(self.stage_sweep.samples)
        if sensitivity is not None:
            self.promise.note(
                "per-stage rounds: the iteration grew by "
                + ", ".join(f"{a:.0%}" for a in sensitivity)
                + " of each stage's added busy time (plans are scored with the larger of "
                "that and the pipeline's own timing)"
            )
        self.stage_sensitivity = sensitivity
        return StageLimits(self.deadline_s, self.max_slowdown, sensitivity)

    @property
    def per_stage(self) -> bool:
        """Whether the job's plans are per-stage constant clocks (fitted already)."""
        return self.stage_curves is not None

    def _reference_due(self) -> bool:
        """Whether this round is one of the deployed plan's all-max reference rounds: every
        `reference_every`-th round of a plan, and every round while the guard holds fewer
        all-max rounds than `baseline_rounds` (a coordinator restarted from a dump without
        ``guard.json`` measures them again before the guard can check the plan)."""
        if not (self.promise.guarded and self.phase is PerseusPhase.DEPLOYED) or self._overrides:
            return False
        if len(self.guard.baseline) < self.baseline_rounds:
            return True
        every = self.reference_every
        return bool(every) and (self._round - self.promise.plan_since) % every == every - 1

    def pipeline_overrides(self) -> dict[int, StagePlan]:
        return {} if self._ran == "baseline" else self._overrides

    def on_measurement(
        self, measurement: RoundMeasurement | None, results: list[ProfilingResult]
    ) -> None:
        issued = self._ran
        if issued.startswith("sweep") and self.sweep is not None:
            self.sweep.observe(measurement)
        if issued == "stage-sweep" and self.stage_sweep is not None:
            self.stage_sweep.observe(measurement)
        if measurement is None:
            return
        self.progress.count(results, measurement.iteration_time_s)
        figures = RoundFigures(self._round, measurement.typical_time_s, measurement.job_energy_j)
        if issued == "baseline" and self.sweep is not None and not self.sweep.done:
            self.sweep.absorb(measurement)  # all-max windows: the blocking power, the top clock
            if self.phase is PerseusPhase.PROFILING and self._round > 0:
                self.progress.saw_all_max(measurement)
                self._all_max_rounds.append(measurement)
                if self.stage_sweep is not None:
                    self.stage_sweep.add_all_max(measurement)
        if issued in ("baseline", "sweep-max") and self._round > 0:
            self.promise.add_baseline(figures)
            if issued == "baseline" and self.sweep is not None and measurement.p2p_power_w:
                self.sweep.p2p_samples.append(measurement.p2p_power_w)
        # The reference rounds while a profile's plan runs, spaced out: the drift from the
        # all-max rounds the profile was taken with (a cool-down's dense all-max rounds
        # would let a passing stall fill the window).
        if issued == "baseline" and self.phase is PerseusPhase.DEPLOYED and self._round > 0:
            drifted = self.drift.observe(figures)
            if drifted is not None:
                self._reprofile(drifted)
                return
        if self.phase is PerseusPhase.PROFILING:
            if issued in ("sweep", "stage-sweep"):
                freqs = [[f for _, f in rank] for rank in self._last_plan]
                self.progress.sweep_rounds.append((freqs, measurement.iteration_time_s))
                self.progress.add_sweep_round(figures, self.baseline)
            if issued == "stage-sweep" and self.sweep is not None:
                self.sweep.cost.add(measurement)  # in profiling.json's cost
            baseline_round = issued in ("baseline", "sweep-max")
            self.promise.note(
                self.progress.note(
                    self._round,
                    self._profiling_sweep(),
                    baseline_round=baseline_round,
                    what="per-stage clock sweep" if issued == "stage-sweep" else None,
                )
            )
            return
        if issued == self.phase.value:
            self.promise.plan_rounds.append(figures)
            if self.phase is PerseusPhase.DEPLOYED and self.promise.guarded:
                decision = self.guard.observe(figures)
                if decision is not None:
                    self._on_guard(decision)
            elif self.phase is PerseusPhase.ALL_MAX and self.guard.cool(figures):
                self._redeploy()  # after a cool-down of fresh all-max rounds: the plan again
        if self.phase is not PerseusPhase.PROFILING and self.promise.guarded:
            self.promise.save(self._round)  # at most every SAVE_EVERY rounds
        if (
            self.phase is PerseusPhase.DEPLOYED
            and self.profile is not None
            and self.stragglers.detect(measurement, self.num_stages, self._expected_busy_s)
        ):
            self._update_overrides()

    # ------------------------------------------------------------------ solve & deploy
    def _deploy(self) -> None:
        """From a complete profile to a deployed plan, or all-max saying why: calibrate,
        check and start the frontier's solve (`_start_solve`), wait for it at each round
        while it runs in its process (all-max meanwhile: `plan_next`), then choose and check
        the point (`Deployer.choose`) and deploy it. Called at every round until decided."""
        deployer = self.deployer
        if deployer.solve is None:
            solve = self._start_solve()
            if solve is None or solve.background:
                return  # held; or this round runs all-max, the first after the solve deploys
        solve = deployer.solve
        assert solve is not None
        if not deployer.solved():
            if solve.done() and deployer.failure is not None:
                self._solve_failed(deployer.failure)
            return  # all-max meanwhile; cancelled: the job has ended
        if solve.background:
            logger.info(
                "Job %s: frontier solved in its process in %.1f s; deploying at round %d",
                self.job_info.job_id,
                solve.seconds or 0.0,
                self._round,
            )
        model = self._scoring()
        try:
            chosen, problems = deployer.choose(
                model,
                deadline_s=self.deadline_s,
                max_slowdown=self.max_slowdown,
                # Whether the job can tell the saving from noise matters to the guard, which
                # measures it; with the guard off nothing is measured against all-max.
                baseline_energies_j=(
                    [r.energy_j for r in self.baseline] if self.promise.guarded else []
                ),
            )
        except PerseusError as exc:  # e.g. a deadline no plan meets: a planning problem
            self.report_profiling(None)
            self._hold("held", [f"no frontier point to deploy: {exc}"])
            return
        self.report_profiling(chosen)
        if problems:
            self._hold("held", problems)
            return
        if self.deadline_s is not None:
            all_max_t = model.all_max().iteration_time
            self.guard.budget = max(0.0, self.deadline_s / all_max_t - 1.0)
        self._run(chosen, "deployed", f"budget {self.guard.budget:.2%}", costs=model.costs)

    def _start_solve(self) -> FrontierSolve | None:
        """Calibrate the costs, check the profile and start the frontier's solve (in a
        process of its own for pipelines over `solve_on_thread_above` instructions); None:
        held."""
        if self.profile is None and self._too_short():
            self.profile = self._per_stage_profile()  # max clock only without the rounds
        profile, p2p = self.complete_profile()
        base_t = median_figures(self.baseline)[0] if self.baseline else None
        self.model = model = PlanModel.calibrated(
            self.job_info.job_id,
            self.pipeline,
            profile,
            p2p,
            self.perseus_args,
            rank_infos=self.rank_infos,
            baseline_time_s=base_t,
            rounds=self.progress.sweep_rounds,
        )
        model.after_work = self._after_work()
        self.promise.costs_known(model.costs)
        problems = profile_problems(
            profile, switch_latency_s=model.costs.switch_latency_s, per_stage=self.per_stage
        )
        unphysical = self.sweep.estimates.unphysical_at_max() if self.sweep is not None else []
        left_out = (
            [e for e in self.sweep.left_out if not e["max_clock"]] if self.sweep is not None else []
        )
        if left_out:
            reason = (
                f"{len(left_out)} profile row(s) below the max clock that no GPU of the job "
                "can produce (a power it cannot draw or the windows could not tell, a time "
                "not measured at the row's clock or faster than a higher clock's) are left "
                "out of the plan: "
                + "; ".join(
                    f"stage {e['stage']} {e['instruction']} at {e['frequency']} MHz"
                    for e in left_out[:3]
                )
                + (f" and {len(left_out) - 3} more" if len(left_out) > 3 else "")
            )
            # On record too (``/jobs``' promise list), with every row and its reason.
            self.promise.record(
                self._round,
                "profile_left_out",
                reason,
                warning=True,
                text=reason,
                rows=[
                    {k: e[k] for k in ("stage", "instruction", "frequency", "reason")}
                    for e in left_out[:MAX_LEFT_OUT_LISTED]
                ],
                rows_left_out=len(left_out),
            )
        if self.per_stage:
            unphysical = [
                f"stage {c.stage} at {c.freqs[0]} MHz ({c.unphysical_at_max}, read from the "
                "per-stage rounds: the power drawn after work stops is charged to busy time)"
                for c in self.stage_curves or []
                if c.unphysical_at_max is not None
            ]
        if unphysical:
            problems.append(
                "the profile's max-clock rows include powers no GPU of the job can draw, which "
                "every plan's accounting would rest on: "
                + "; ".join(unphysical[:3])
                + (f" and {len(unphysical) - 3} more" if len(unphysical) > 3 else "")
            )
        if problems:
            self.report_profiling(None)
            self._hold("held", problems)
            return None
        if self.per_stage:  # per-stage plans: a few thousand at most, scored in the round
            model.per_stage = self._stage_limits()
        n = self.pipeline.num_instructions
        background = n > self.perseus_args.solve_on_thread_above and not self.per_stage
        solve = self.deployer.start(model, self.settings, background=background)
        if background and solve.failure is None:
            queued = " (waiting for a free solver first)" if solve.waiting else ""
            self.promise.note(
                f"solving the frontier of {n:,} instructions in a process of its own"
                f"{queued}; all-max meanwhile"
            )
        return solve

    def _solve_failed(self, failure: SolveFailedError) -> None:
        """Hold all-max because the frontier could not be solved, saying why: the job's
        log, a ``solve_failed`` event (``promise.jsonl``, ``/jobs``, the metric
        ``perseus_solve_failures_total``), the hold's own event. The job goes on."""
        retry_in = self.deployer.failed(self._round)
        reason = (
            f"the frontier solve failed ({failure.kind}): {failure.reason}; tried again in "
            f"{retry_in} rounds"
        )
        logger.warning("Job %s: %s; all-max meanwhile", self.job_info.job_id, reason)
        seconds = None if self.deployer.solve is None else self.deployer.solve.seconds
        self.promise.record(
            self._round,
            "solve_failed",
            reason,
            text=None,
            failure=failure.kind,
            seconds=seconds,
            retry_in_rounds=retry_in,
        )
        self.report_profiling(None)
        self._hold("held", [reason])

    def close(self) -> None:
        """The job ended, failed or was evicted, or the coordinator shuts down: stop its
        frontier solve (`Deployer.close`). Quick: called on the event loop."""
        self.deployer.close()

    def _after_work(self) -> AfterWork | None:
        """What the GPUs draw after their work stops, as the profile's fit found it: from the
        sweep, else (a restarted coordinator) from the job's ``profiling.json``; None when
        neither says (an unreadable figure is logged and left out)."""
        from perseus.planning import AfterWork

        path = self.job_dir.profiling
        where = "the fit" if self.sweep is not None else str(path)
        try:  # never a reason to fail the job: unusable shares are left out
            if self.sweep is not None:
                shares = self.sweep.estimates.after_work_shares()
                return AfterWork(shares) if shares else None
            data = json.loads(path.read_text()).get("after_work_shares") if path.exists() else None
            return AfterWork.from_json(data) if data else None
        except (OSError, ValueError, AttributeError) as exc:
            logger.warning(
                "Job %s: the after-work shares from %s are unreadable (%s): predicted savings "
                "leave the power after work stops out",
                self.job_info.job_id,
                where,
                exc,
            )
            return None

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
        if self.per_stage:
            reason = f"{reason}; per-stage plan: {self._per_stage_why()}"
        self.adopt(plan)
        self.phase = PerseusPhase.DEPLOYED
        if event == "deployed":  # a new profile's plan: its all-max rounds are the reference
            self.drift.arm([r for r in self.baseline if r.round >= self._profiled_from])
        first = self._first_round_of_a_new_plan()
        self.promise.deployed(self._round, first, plan, event, reason, costs=costs)
        self.promise.save(self._round, force=True)
        self._update_overrides()

    def _hold(self, event: str, problems: list[str]) -> None:
        """Run all-max, saying why: from now on (``held``: a check before deployment
        failed), or for the guard's cool-down (``fallback``: the plan is re-deployed after
        it, `_redeploy`)."""
        all_max = self._scoring().all_max()
        if self.per_stage and event == "held":
            problems = [*problems, f"per-stage plans were tried: {self._per_stage_why()}"]
        self.adopt(all_max)
        self.phase = PerseusPhase.ALL_MAX
        first = self._first_round_of_a_new_plan()
        self.promise.held(self._round, first, all_max, event, problems)
        self.promise.save(self._round, force=True)
        self._update_overrides()

    def baseline_plan(self) -> Plan | None:
        """The all-max plan scored by the same model as the deployed plan."""
        if self.model is None or self.model.profile is None:
            return None
        return self.model.all_max()

    # ------------------------------------------------------------------ the guard
    def _on_guard(self, decision: GuardDecision) -> None:
        if self.per_stage:
            # A per-stage plan's time is the stages' measured sensitivity, which re-scoring
            # with the measured hop latency does not hold: such a move was predicted at
            # +5.8 % and ran +15.3 % (CI, 2026-11-29). The guard falls back instead.
            move, reason = self.promise.verdict(
                self._round,
                decision,
                lambda _: None,
                no_faster="a per-stage plan is not re-scored with measured costs: all-max",
            )
        else:
            move, reason = self.promise.verdict(self._round, decision, self._faster_plan)
        if move is not None and reason is not None:
            self._run(move, "move", reason)
        elif reason is not None:
            self._hold("fallback", [reason])
        else:
            self.promise.save(self._round, force=True)

    def _redeploy(self) -> None:
        """The cool-down after a fall-back is over: deploy the plan chosen for the budget
        again (the frontier's cheapest point within it), watched as a new deployment, if
        the fresh all-max rounds let the guard tell its saving from their spread; else cool
        down again, longer. Without a frontier to choose from, all-max stays for good."""
        try:
            model = self._scoring()
            plan = model.choose(deadline_s=self.deadline_s, max_slowdown=self.max_slowdown)
        except PlanError as exc:
            self.guard.hold()
            self.promise.record(
                self._round,
                "check",
                f"no plan to re-deploy ({exc}): all-max stays",
                warning=True,
                text=f"guard: no plan to re-deploy ({exc}): all-max stays",
            )
            self.promise.save(self._round, force=True)
            return
        saving, _ = self._predicted(plan)
        problem = self.guard.redeploy_problem(saving)
        if problem is not None:
            rounds = self.guard.cool_longer()
            reason = f"re-deployment declined: {problem}; all-max for {rounds} more round(s)"
            self.promise.record(
                self._round,
                "check",
                reason,
                warning=True,
                text=f"guard: {reason}",
                cooldown_rounds=rounds,
            )
            self.promise.save(self._round, force=True)
            return
        self._run(
            plan,
            "redeploy",
            f"after a cool-down of all-max rounds (fall-back {self.guard.fallbacks}), "
            f"measured against {len(self.baseline)} fresh all-max round(s)",
        )

    def _reprofile(self, why: str) -> None:
        """The GPUs drifted from the profile (`perseus.schedulers.perseus_scheduler.drift`): profile the job again as
        at its start (all-max rounds, then the sweep, or per-stage rounds), solve, check and
        deploy the new profile's plan. The running plan is withdrawn meanwhile (profiling
        rounds run their own clocks); the guard's all-max window, the energy totals and the
        record go on. A profile given by path is measured afresh: it no longer describes the
        GPUs."""
        self.promise.record(
            self._round,
            "reprofile",
            why,
            warning=True,
            text=f"guard: {why}; profiling the job again",
        )
        self.drift.reset()
        # The all-max rounds before the drift no longer describe all-max: the new profile's
        # lead-in measures the guard's window afresh.
        self.guard.baseline.clear()
        self._profiled_from = self._round + 1
        args = self._sweep_args.model_copy(update={"profile_path": None})
        self.init_profile_source(args)
        self.profile = None
        self.deployer.reset()
        self.stage_sweep = None
        self.stage_curves = None
        self.stage_sensitivity = None
        self._all_max_rounds = []
        self._overrides = {}
        self.progress.restart(self._round + 1 + self.baseline_rounds)
        self.phase = PerseusPhase.PROFILING
        self.promise.save(self._round, force=True)

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
            max_slowdown=self.guard.budget,
        )

    # ------------------------------------------------------------------ reporting
    def _profiling_sweep(self) -> InstructionSweep | StageClockSweep | None:
        """The sweep whose rounds profiling still runs (the per-stage one once started)."""
        return self.stage_sweep if self.stage_sweep is not None else self.sweep

    def profiling_extras(self) -> dict[str, Any]:
        """``profiling.json``'s plan kind, and a per-stage plan's fitted clocks."""
        if not self.per_stage or self.stage_curves is None or self.stage_sweep is None:
            return {"plan_kind": "per-instruction"}
        return {
            "plan_kind": "per-stage",
            "per_stage_reason": self._per_stage_why(),
            "stage_clock_rounds": len(self.stage_sweep.rounds),
            "time_sensitivity": self.stage_sensitivity,
            "stage_clocks": [
                {
                    "stage": c.stage,
                    "frequencies": c.freqs,
                    "time_ratio": c.time_ratio,
                    "time_ratio_se": c.time_ratio_se,
                    "busy_power_w": c.power_w,
                    "busy_power_se_w": c.power_se_w,
                    "samples": c.samples,
                    "left_out": c.left_out,
                }
                for c in self.stage_curves
            ],
        }

    def promise_events(self) -> list[dict[str, Any]]:
        """The plan's deployments, checks and moves since the last call (or report)."""
        return self.promise.story.take_events()

    def report(self) -> RoundReport:
        """The deployed plan and its baseline (`PlanningScheduler.report`), the job's status
        for rank 0 and the promise's events since the last report."""
        return dataclasses.replace(
            super().report(), status=self.status(), events=self.promise_events()
        )

    def summary(self) -> str:
        """The job's measured figures so far, one line."""
        text = self.progress.totals()
        if self.phase is PerseusPhase.PROFILING:
            return text
        return self.promise.summary(text, held=self.phase is PerseusPhase.ALL_MAX)

    def status(self) -> RoundStatus:
        """Where the job stands and what rank 0 should log (notes since the last call)."""
        notes = self.promise.story.take_notes()
        estimate = None
        if self.phase is PerseusPhase.PROFILING:
            left = self.progress.rounds_left(self._round, self._profiling_sweep())
            estimate = self._round + 1 + left
        return RoundStatus(
            phase=self.phase.value,
            round=max(0, self._round),
            profiling_rounds=estimate,
            notes=notes,
            summary=self.summary(),
        )

    def resume(self, plan: Plan) -> None:
        """Go back to a persisted plan (restarted coordinator), guarded as before.

        The frontier is read back from ``frontier/`` when present, so straggler handling
        and re-deployments after a fall-back keep working. The guard is re-armed from
        ``guard.json`` (`Promise.load`: its all-max rounds, its state and back-off): a plan
        it watched or kept is checked again from its next rounds, a cool-down goes on (and
        ends in a re-deployment), a hold stays. From a dump without ``guard.json`` (written
        before it existed, or unreadable) the guard starts afresh: the first
        `baseline_rounds` rounds run all-max (`_reference_due`), then it checks the plan; a
        persisted all-max plan then stays as it was (why it ran is not known). Round numbers
        go on from the dump's last round.
        """
        self.adopt(plan)
        self.p2p_power_w = plan.p2p_power
        if self.profile is None and self.job_dir.profile.exists():
            self.profile = load_profile(self.job_dir.profile)
        self.model = PlanModel.of_plan(
            self.job_info.job_id, self.pipeline, self.profile, plan, self.job_dir.frontier
        )
        self.model.after_work = self._after_work()
        self.sweep = None
        self.phase = PerseusPhase.DEPLOYED
        state = self.promise.load()
        rounds = self.job_dir.rounds()
        last = rounds[-1] if rounds else int(state["round"]) if state is not None else 0
        self._round = max(self._round, last, 0)
        self.promise.plan_since = self._round + 1
        self.promise.plan_rounds.clear()
        all_max = self._chosen_plan == self.max_plan()
        if self.promise.guarded:
            self._rearm_guard(plan, state, all_max=all_max)
        self._update_overrides()

    def _rearm_guard(self, plan: Plan, state: dict[str, Any] | None, *, all_max: bool) -> None:
        """`resume`'s guard: restored from `state` (``guard.json``), else afresh."""
        try:
            _, slowdown = self._predicted(plan)
        except PlanError:  # no profile in the dump to score it with
            slowdown = 0.0
        if state is None:
            if all_max:  # held or fallen back before the restart: all-max stays, unwatched
                self.guard.hold()
                self.phase = PerseusPhase.ALL_MAX
                return
            self.guard.watch(slowdown)
            reason = (
                f"coordinator restarted without the guard's state ({self.job_dir.GUARD}): the "
                f"guard re-measures {self.baseline_rounds} all-max round(s), then checks the plan"
            )
        else:
            self.guard.restore(state["guard"])
            if self.guard.state is GuardState.ALL_MAX:
                self.phase = PerseusPhase.ALL_MAX
                reason = "coordinator restarted: all-max stays (held before the restart)"
            elif self.guard.cooling and (all_max or self.profile is not None):
                self.phase = PerseusPhase.ALL_MAX
                if not all_max:  # killed between the fall-back and its plan's dump
                    self.adopt(self._scoring().all_max())
                reason = (
                    "coordinator restarted: the guard's cool-down goes on "
                    f"({self.guard.cooldown_left} all-max round(s) left)"
                )
            else:
                if self.guard.cooling:  # cooling, but no profile to score all-max with
                    self.guard.watch(slowdown)
                self.guard.predicted_slowdown = slowdown  # `restore` watches it again
                reason = (
                    f"coordinator restarted: the guard checks the plan again against its "
                    f"{len(self.baseline)} all-max round(s)"
                )
        self.promise.record(self._round, "resumed", reason, text=reason)
        self.promise.save(self._round, force=True)

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
