"""The frontier solve: never in the way of the job's rounds, never the end of the job.

At 16 stages × 256 microbatches with clock switches counted, the frontier takes minutes of
CPU and ~0.8 GB. Solved inside the round that completes profiling, every rank would wait
that long for its next schedule; solved on a thread, it would share the coordinator's
interpreter with the event loop of every job. `FrontierSolve` runs such a solve in a
process of its own (`perseus.schedulers.perseus_scheduler.solve_pool`: at most ``PERSEUS_SOLVE_WORKERS`` at once for
the whole coordinator, stopped after ``PERSEUS_SOLVE_TIMEOUT_S``, killed when the job ends,
fails or is evicted: `Deployer.close`); the `Perseus` scheduler keeps handing out
all-max rounds (more reference rounds for the guard) and deploys at the first round after
the solve is done. Small pipelines (`solve_on_thread_above` instructions or fewer) are
solved at once, in the round, as before (a process would only add a round of all-max).

A solve that fails (it raised, ran out of memory or time, or its process died) never fails
the job: `Perseus._deploy` holds all-max, saying why (the job's log, ``promise.jsonl``
and ``/jobs``: a ``solve_failed`` event, counted by ``perseus_solve_failures_total``).
"""

from __future__ import annotations

import logging
import shutil
import time
from concurrent.futures import CancelledError
from pathlib import Path
from typing import Any

from perseus.domain.plan import Plan
from perseus.schedulers.perseus_scheduler.checks import plan_problems
from perseus.schedulers.perseus_scheduler.guard import MAX_COOLDOWN_ROUNDS
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

__all__ = ["Deployer", "FrontierSolve"]

logger = logging.getLogger(__name__)

SOLVE_RETRY_ROUNDS = 100
"""Rounds of all-max after a first failed solve before it is tried again (a transient
failure: memory taken by other solves, a timeout under load); doubling at each failure up to
`perseus.schedulers.perseus_scheduler.guard.MAX_COOLDOWN_ROUNDS`."""


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
            except Exception as exc:  # any of it holds all-max (`Perseus._deploy`)
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


class Deployer:
    """`Perseus`'s part from a calibrated plan model to the plan to deploy: it runs the
    frontier's solve (`FrontierSolve`: here, or in a process of the coordinator's pool when
    the pipeline is big), backs off after a failed one, and chooses and checks the point.
    It owns the solve and its back-off; the scheduler gives it the model and acts on what
    it decides (`perseus.schedulers.perseus_scheduler.scheduler.Perseus._deploy`)."""

    def __init__(self, frontier_dir: Path, *, name: str) -> None:
        self.frontier_dir = frontier_dir
        self.name = name
        self.solve: FrontierSolve | None = None
        """The current profile's solve (None: not started, or dropped by `reset`)."""
        self.failures = 0
        """Solves that failed so far (the back-off doubles with each)."""
        self.retry_at: int | None = None
        """After a failed solve: the round it is tried again (`failed`)."""

    def start(
        self, model: PlanModel, settings: PerseusSettings, *, background: bool
    ) -> FrontierSolve:
        """Solve `model`'s frontier: now (``background=False``), or in a process, within the
        coordinator's limits in force (`settings`: memory, time, solver processes)."""
        self.solve = FrontierSolve(
            model, self.frontier_dir, settings, background=background, name=self.name
        )
        return self.solve

    def solved(self) -> bool:
        """Whether the solve has ended with a frontier in the model. False while it runs,
        when it was cancelled (the job ended), or when it failed (`failure`)."""
        solve = self.solve
        if solve is None or not solve.done() or solve.cancelled:
            return False
        return solve.finish()

    @property
    def failure(self) -> SolveFailedError | None:
        """Why the solve ended without a frontier (None: it did not fail)."""
        return None if self.solve is None else self.solve.failure

    def failed(self, round_: int) -> int:
        """A solve failed at `round_`: the rounds until it is tried again
        (`SOLVE_RETRY_ROUNDS`, doubling with each failure up to
        `perseus.schedulers.perseus_scheduler.guard.MAX_COOLDOWN_ROUNDS`)."""
        self.failures += 1
        retry_in = min(SOLVE_RETRY_ROUNDS * 2 ** (self.failures - 1), MAX_COOLDOWN_ROUNDS)
        self.retry_at = round_ + retry_in
        return retry_in

    def retry_due(self, round_: int) -> bool:
        """Whether a failed solve's back-off is over at `round_`: then the solve is dropped
        and the next `Perseus._deploy` solves again."""
        if self.retry_at is None or round_ < self.retry_at:
            return False
        self.reset()
        return True

    def choose(
        self,
        model: PlanModel,
        *,
        deadline_s: float | None,
        max_slowdown: float,
        baseline_energies_j: list[float],
    ) -> tuple[Plan, list[str]]:
        """The frontier point to deploy and what its checks found against it
        (`perseus.schedulers.perseus_scheduler.checks.plan_problems`; empty: deploy it).

        Raises:
            PerseusError: No frontier point meets the deadline or the budget.
        """
        chosen = model.choose(deadline_s=deadline_s, max_slowdown=max_slowdown)
        saving, slowdown = model.predicted(chosen)
        problems = plan_problems(
            predicted_saving=saving,
            predicted_slowdown=slowdown,
            baseline_energies_j=baseline_energies_j,
        )
        return chosen, problems

    def reset(self) -> None:
        """Forget the solve (a new profile is taken; or a back-off is over)."""
        self.solve = None
        self.retry_at = None

    def close(self) -> None:
        """The job ended, failed or was evicted, or the coordinator shuts down: stop its
        solve (its process is killed; `FrontierSolve.cancel`). Quick: called on the event
        loop."""
        if self.solve is not None:
            self.solve.cancel()
