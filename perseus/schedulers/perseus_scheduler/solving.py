"""The frontier solve: never in the way of the job's rounds, never the end of the job.

At 16 stages × 256 microbatches with clock switches counted, the frontier takes minutes of
CPU and ~0.8 GB. Solved inside the round that completes profiling, every rank would wait
that long for its next schedule; solved on a thread, it would share the coordinator's
interpreter with the event loop of every job. `FrontierSolve` runs such a solve in a
process of its own (`perseus.schedulers.perseus_scheduler.solve_pool`: at most ``PERSEUS_SOLVE_WORKERS`` at once for
the whole coordinator, stopped after ``PERSEUS_SOLVE_TIMEOUT_S``, killed when the job ends,
fails or is evicted: `DeployStep.close`); the `Perseus` scheduler keeps handing out
all-max rounds (more reference rounds for the guard) and deploys at the first round after
the solve is done. Small pipelines (`solve_on_thread_above` instructions or fewer) are
solved at once, in the round, as before (a process would only add a round of all-max).

A solve that fails (it raised, ran out of memory or time, or its process died) never fails
the job: `DeployStep._deploy` holds all-max, saying why (the job's log, ``promise.jsonl``
and ``/jobs``: a ``solve_failed`` event, counted by ``perseus_solve_failures_total``).
"""

from __future__ import annotations

import logging
import shutil
import time
from concurrent.futures import CancelledError
from pathlib import Path
from typing import Any

from perseus.errors import PerseusError
from perseus.schedulers.perseus_scheduler.checks import plan_problems, profile_problems
from perseus.schedulers.perseus_scheduler.guard import MAX_COOLDOWN_ROUNDS, median_figures
from perseus.schedulers.perseus_scheduler.plan_model import (
    PlanModel,
    SolveRequest,
    solve_in_process,
)
from perseus.schedulers.perseus_scheduler.solve_pool import (
    PoolSolve,
    SolveCancelledError,
    SolveFailedError,
    solve_pool,
)
from perseus.settings import PerseusSettings

__all__ = ["DeployStep", "FrontierSolve"]

logger = logging.getLogger(__name__)

SOLVE_RETRY_ROUNDS = 100
"""Rounds of all-max after a first failed solve before it is tried again (a transient
failure: memory taken by other solves, a timeout under load); doubling at each failure up to
`perseus.schedulers.perseus_scheduler.guard.MAX_COOLDOWN_ROUNDS`."""

MAX_LEFT_OUT_LISTED = 64
"""Left-out profile rows a ``profile_left_out`` event lists (the count says how many)."""


def _failure_of(exc: BaseException) -> SolveFailedError:
    """What a solve run here raised, as a `SolveFailedError` (its kind and one line)."""
    if isinstance(exc, SolveFailedError):
        return exc
    kind = "memory" if isinstance(exc, MemoryError) else "error"
    text = str(exc) or "out of memory"
    return SolveFailedError(kind, f"{type(exc).__name__}: {text}")


class FrontierSolve:
    """One job's frontier solve, here and now (``background=False``) or in a process of
    the coordinator's solve pool. It never raises: once `done`, `finish` reads the
    frontier into the model, or says it could not (`failure`; `cancelled`)."""

    def __init__(
        self,
        model: PlanModel,
        frontier_dir: Path,
        settings: PerseusSettings,
        *,
        background: bool,
        name: str,
    ) -> None:
        self.model = model
        self.frontier_dir = frontier_dir
        self.background = background
        self.seconds: float | None = None
        """How long the solve ran (None: still running or waiting for its turn)."""
        self.failure: SolveFailedError | None = None
        """Why there is no frontier (None: there is one, or the solve has not ended)."""
        self._request: SolveRequest | None = None
        self._pool_solve: PoolSolve[dict[str, Any]] | None = None
        budget = settings.solve_memory_mb
        budget_bytes = None if budget is None else budget * 2**20
        _remove_leftovers(frontier_dir)
        if not background:
            t0 = time.perf_counter()
            try:
                model.solve(frontier_dir, memory_budget_bytes=budget_bytes)
            except Exception as exc:  # any of it holds all-max (`DeployStep._deploy`)
                self.failure = _failure_of(exc)
            self.seconds = time.perf_counter() - t0
            return
        try:
            self._request = model.solve_request(frontier_dir, memory_budget_bytes=budget_bytes)
            self._pool_solve = solve_pool(settings.solve_workers).submit(
                solve_in_process,
                self._request,
                name=name,
                timeout_s=settings.solve_timeout_s,
                memory_bytes=budget_bytes,
            )
        except Exception as exc:
            self.failure = _failure_of(exc)
            return
        request = self._request
        self._pool_solve.future.add_done_callback(
            lambda f: None if _succeeded(f) else shutil.rmtree(request.out_dir, ignore_errors=True)
        )

    @property
    def on_thread(self) -> bool:
        """`background`, by its older name (such solves ran on a thread before)."""
        return self.background

    @property
    def pid(self) -> int | None:
        """The process solving now (None: none)."""
        return None if self._pool_solve is None else self._pool_solve.pid

    @property
    def cancelled(self) -> bool:
        return self._pool_solve is not None and self._pool_solve.cancelled

    @property
    def waiting(self) -> bool:
        """Queued behind other jobs' solves (``PERSEUS_SOLVE_WORKERS`` run at once)."""
        return self._pool_solve is not None and self._pool_solve.started_at is None

    def done(self) -> bool:
        """Whether the solve has ended (well or not)."""
        return self._pool_solve is None or self._pool_solve.done()

    def cancel(self) -> None:
        """Stop the solve (its process is killed); safe to call at any time, from the
        event loop too (it does not wait)."""
        if self._pool_solve is not None:
            self._pool_solve.cancel()

    def finish(self) -> bool:
        """Once `done`: whether the model has its frontier now (read from the solve's
        directory, renamed into place); False with `failure` (or `cancelled`) set."""
        if self.failure is not None:
            return False
        if self._pool_solve is None:
            return self.model.frontier is not None
        if self.model.frontier is not None:
            return True
        pool_solve, request = self._pool_solve, self._request
        assert request is not None
        self.seconds = pool_solve.seconds
        try:
            pool_solve.future.result(timeout=0)
            self.model.adopt_solved(request, self.frontier_dir)
        except (SolveCancelledError, CancelledError):
            return False
        except Exception as exc:  # a failure in the process, or reading its frontier back
            self.failure = _failure_of(exc)
            shutil.rmtree(request.out_dir, ignore_errors=True)
            return False
        return True


def _succeeded(future: Any) -> bool:
    return not future.cancelled() and future.exception() is None


def _remove_leftovers(frontier_dir: Path) -> None:
    """Directories a solve or a swap interrupted by a crash left beside `frontier_dir`
    (``frontier.tmp-*``, ``frontier.old-*``): one solve per job runs at a time."""
    parent = frontier_dir.parent
    if not parent.is_dir():
        return
    for pattern in (f"{frontier_dir.name}.tmp-*", f"{frontier_dir.name}.old-*"):
        for path in parent.glob(pattern):
            shutil.rmtree(path, ignore_errors=True)


class DeployStep:
    """`Perseus`'s step from a complete profile to a deployed plan (mixed into
    `perseus.schedulers.perseus_scheduler.scheduler.Perseus`, whose state it reads and sets): calibrate the
    costs, check the profile, solve the frontier (in a process when it is big), choose the
    point, check it, deploy it or hold all-max. `_deploy` is called at every round until it
    has decided; while the solve runs, `Perseus.plan_next` hands out all-max rounds."""

    _solve: FrontierSolve | None
    _solve_failures: int
    _solve_retry_at: int | None

    def _deploy(self) -> None:
        if self._solve is None:
            self._solve = self._start_solve()
            if self._solve is None or self._solve.background:
                return  # held; or this round runs all-max, the first after the solve deploys
        solve = self._solve
        if not solve.done() or solve.cancelled:
            return  # all-max meanwhile; cancelled: the job has ended
        if not solve.finish():
            if solve.failure is not None:
                self._solve_failed(solve.failure)
            return
        if solve.background:
            logger.info(
                "Job %s: frontier solved in its process in %.1f s; deploying at round %d",
                self.job_info.job_id,
                solve.seconds or 0.0,
                self._round,
            )
        model = self._scoring()
        try:
            chosen = model.choose(deadline_s=self.deadline_s, max_slowdown=self.max_slowdown)
        except PerseusError as exc:  # e.g. a deadline no plan meets: a planning problem
            self.report_profiling(None)
            self._hold("held", [f"no frontier point to deploy: {exc}"])
            return
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
        self.promise.costs_known(model.costs)
        problems = profile_problems(
            profile, switch_latency_s=model.costs.switch_latency_s, per_stage=self.per_stage
        )
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
        solve = FrontierSolve(
            model,
            self.job_dir.frontier,
            self.settings,
            background=background,
            name=f"perseus-solve-{self.job_info.job_id}",
        )
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
        self._solve_failures += 1
        retry_in = min(SOLVE_RETRY_ROUNDS * 2 ** (self._solve_failures - 1), MAX_COOLDOWN_ROUNDS)
        self._solve_retry_at = self._round + retry_in
        reason = (
            f"the frontier solve failed ({failure.kind}): {failure.reason}; tried again in "
            f"{retry_in} rounds"
        )
        logger.warning("Job %s: %s; all-max meanwhile", self.job_info.job_id, reason)
        seconds = None if self._solve is None else self._solve.seconds
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

    def _solve_retry_due(self) -> bool:
        """Whether a failed solve's back-off is over (`_solve_failed`): then the next round
        solves again (all-max while it runs), and deploys or holds as after profiling."""
        if self._solve_retry_at is None or self._round < self._solve_retry_at:
            return False
        self._solve_retry_at = None
        self._solve = None
        return True

    def close(self) -> None:
        """The job ended, failed or was evicted, or the coordinator shuts down: stop its
        solve (its process is killed; `FrontierSolve.cancel`). Quick: called on the event
        loop."""
        if self._solve is not None:
            self._solve.cancel()
