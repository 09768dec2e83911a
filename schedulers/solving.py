"""The frontier solve, on a thread of its own when it takes long.

At 16 stages × 256 microbatches with clock switches counted, the frontier takes minutes of
CPU. Solved inside the round that completes profiling, every rank would wait that long for
its next schedule. `FrontierSolve` runs such a solve on a thread of its own instead: the
`Perseus` scheduler keeps handing out all-max rounds (more reference rounds for the guard)
and deploys at the first round after the solve is done. Small pipelines are solved at once,
as before (a thread would only add a round of all-max).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from schedulers.checks import plan_problems, profile_problems
from schedulers.guard import median_figures
from schedulers.plan_model import PlanModel

__all__ = ["DeployStep", "FrontierSolve"]

logger = logging.getLogger(__name__)


class FrontierSolve:
    """`solve()` run now (``on_thread=False``) or on a daemon thread; `done` says when it
    ended, `result` raises what it raised."""

    def __init__(self, solve: Callable[[], object], *, on_thread: bool, name: str) -> None:
        self.on_thread = on_thread
        self.seconds: float | None = None
        """How long the solve took (None: still running)."""
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._solve = solve
        if on_thread:
            threading.Thread(target=self._run, name=name, daemon=True).start()
        else:
            self._run()

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            self._solve()
        except BaseException as exc:  # handed to the round loop by `result`
            self._error = exc
        finally:
            self.seconds = time.perf_counter() - t0
            self._done.set()

    def done(self) -> bool:
        """Whether the solve has ended (well or not)."""
        return self._done.is_set()

    def result(self) -> None:
        """Raise what the solve raised, if anything (call once `done`)."""
        if self._error is not None:
            raise self._error


class DeployStep:
    """`Perseus`'s step from a complete profile to a deployed plan (mixed into
    `schedulers.perseus_scheduler.Perseus`, whose state it reads and sets): calibrate the
    costs, check the profile, solve the frontier (on a thread when it is big), choose the
    point, check it, deploy it or hold all-max. `_deploy` is called at every round until it
    has decided; while the solve runs, `Perseus.plan_next` hands out all-max rounds."""

    _solve: FrontierSolve | None

    def _deploy(self) -> None:
        if self._solve is None:
            self._solve = self._start_solve()
            if self._solve is None or self._solve.on_thread:
                return  # held; or this round runs all-max, the first after the solve deploys
        if not self._solve.done():
            return
        self._solve.result()  # what the solve raised, raised here
        if self._solve.on_thread:
            logger.info(
                "Job %s: frontier solved on its thread in %.1f s; deploying at round %d",
                self.job_info.job_id,
                self._solve.seconds,
                self._round,
            )
        model = self._scoring()
        chosen = model.choose(deadline_s=self.deadline_s, max_slowdown=self.max_slowdown)
        self.report_profiling(chosen)
        saving, slowdown = model.predicted(chosen)
        problems = plan_problems(
            predicted_saving=saving,
            predicted_slowdown=slowdown,
            # Whether the job can tell the saving from noise matters to the guard, which
            # measures it; with the guard off nothing is measured against all-max.
            baseline_energies_j=[r.energy_j for r in self.baseline] if self.promise.guarded else [],
        )
        if problems:
            self._hold("held", problems)
            return
        if self.deadline_s is not None:
            all_max_t = model.all_max().iteration_time
            self.guard.budget = max(0.0, self.deadline_s / all_max_t - 1.0)
        self._run(chosen, "deployed", f"budget {self.guard.budget:.2%}", costs=model.costs)

    def _start_solve(self) -> FrontierSolve | None:
        """Calibrate the costs, check the profile and start the frontier's solve (on a
        thread for pipelines over `solve_on_thread_above` instructions); None: held."""
        if self.profile is None and self._too_short():
            self.profile = self.progress.max_clock_profile(
                self.job_info.job_id, self.max_freq_mhz, self.rank_infos
            )
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
        self.promise.costs_known(model.costs)
        problems = profile_problems(profile, switch_latency_s=model.costs.switch_latency_s)
        unphysical = self.sweep.estimates.unphysical_at_max() if self.sweep is not None else []
        left_out = (
            [e for e in self.sweep.estimates.left_out if not e["max_clock"]]
            if self.sweep is not None
            else []
        )
        if left_out:
            reason = (
                f"{len(left_out)} profile row(s) below the max clock whose power no GPU of the "
                "job can draw (or the windows could not tell) are left out of the plan: "
                + "; ".join(
                    f"stage {e['stage']} {e['instruction']} at {e['frequency']} MHz"
                    for e in left_out[:3]
                )
                + (f" and {len(left_out) - 3} more" if len(left_out) > 3 else "")
            )
            self.promise.note(reason, warning=True)
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
        n = self.pipeline.num_instructions
        on_thread = n > self.perseus_args.solve_on_thread_above
        if on_thread:
            self.promise.note(f"solving the frontier of {n:,} instructions; all-max meanwhile")
        return FrontierSolve(
            lambda: model.solve(self.job_dir.frontier),
            on_thread=on_thread,
            name=f"solve {self.job_info.job_id}",
        )
