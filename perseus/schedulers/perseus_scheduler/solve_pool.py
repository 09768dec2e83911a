"""The coordinator's frontier solves: each in a process of its own, a bounded number at once.

Why a process: a solve of 16 stages × 256 microbatches takes minutes of CPU and ~0.8 GB.
On a thread of the coordinator it shared the interpreter (its GIL) with the event loop that
serves every job (the project's test saw a 2 s solve take 37 s beside a busy loop), and
whatever it raised (a `MemoryError`, a bug) landed in the job's next round and failed the
job. In a process of its own it uses another core, what goes wrong in it stays there (a
failure comes back as a `SolveFailedError`, a crash as its exit code), and it can be stopped.

Why not `concurrent.futures.ProcessPoolExecutor`: its workers are shared, a task that runs
cannot be cancelled, and killing the worker that runs it breaks the whole pool
(``BrokenProcessPool``) for every other job's solve. Here every solve is a fresh process,
forked from a fork server that has the solver imported already (``forkserver``: it starts
in milliseconds, and never forks the coordinator's threads; ``spawn`` where there is no
fork server); at most `SolvePool.workers` run at once, first come first served, the others
wait their turn; `PoolSolve.cancel` kills the process (its job ended, failed or was
evicted), and so does the solve's timeout. A solve's process runs at a lower priority
(`NICE`): on a machine short of cores the event loop's rounds go first. The pool is one per
coordinator process (`solve_pool`), made on first use; its processes end with the
coordinator (daemonic; within a second of a ``kill -9`` too: `_die_with`).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.context import BaseContext
from typing import Any, Generic, TypeVar

from perseus.errors import SolverError

__all__ = ["PoolSolve", "SolveCancelledError", "SolveFailedError", "SolvePool", "solve_pool"]

logger = logging.getLogger(__name__)

A = TypeVar("A")
R = TypeVar("R")

_PRELOAD = ["perseus.schedulers.perseus_scheduler.plan_model", "perseus.planning.frontier", "perseus.solver.frontier"]
"""Imported once by the fork server, so that every solve's process starts with them."""

_JOIN_S = 5.0
"""How long a process that answered may take to exit before it is killed."""

NICE = 10
"""How much lower a solve's process runs than the coordinator (``nice``): on a busy machine
the event loop that answers every job's rounds goes first, the solves take what is left."""


class SolveFailedError(SolverError):
    """A solve that did not finish: what went wrong, for the job's log and a metric.

    Attributes:
        kind: ``error`` (it raised), ``memory`` (a `MemoryError`, or a frontier too big
            for the memory a solve may use), ``crashed`` (its process died without a word:
            a signal, the out-of-memory killer) or ``timeout`` (stopped at its time limit).
        reason: One line saying what happened.
    """

    KINDS = ("error", "memory", "crashed", "timeout")

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


class SolveCancelledError(SolverError):
    """The solve was cancelled (`PoolSolve.cancel`) before it finished."""


def _context() -> BaseContext:
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)  # no effect once the fork server runs
        return ctx
    return multiprocessing.get_context("spawn")


def _vm_size_bytes() -> int | None:
    """This process's address space now (Linux), bytes."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _limit_memory(extra_bytes: int) -> None:
    """Let this process's address space grow by `extra_bytes` at most (where the system
    can say how big it is now): an allocation beyond raises `MemoryError` in it, instead of
    the machine's out-of-memory killer choosing what to kill."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Windows
        return
    now = _vm_size_bytes()
    if now is None:
        return
    limit = now + extra_bytes
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _die_with(pid: int) -> None:
    """Exit when process `pid` (the coordinator) has gone: a coordinator killed outright
    (``kill -9``) runs no clean-up, and its solves, children of the fork server, would
    otherwise run on for their whole time with nobody to read them."""
    while True:
        time.sleep(1.0)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            os._exit(4)
        except OSError:  # alive, another user's (not ours to tell): keep going
            pass


def _child(
    fn: Callable[[Any], Any],
    arg: Any,
    conn: multiprocessing.connection.Connection,
    memory_bytes: int | None,
    coordinator_pid: int,
) -> None:
    """A solve's process: run ``fn(arg)`` and send back ``("ok", result)`` or ``("error",
    kind, text)``."""
    threading.Thread(target=_die_with, args=(coordinator_pid,), daemon=True).start()
    try:
        with contextlib.suppress(OSError, AttributeError):  # not everywhere
            os.nice(NICE)
        if memory_bytes is not None:
            _limit_memory(memory_bytes)
        result = fn(arg)
        message: tuple[Any, ...] = ("ok", result)
    except MemoryError as exc:
        message = ("error", "memory", f"MemoryError: {exc}" if str(exc) else "out of memory")
    except BaseException as exc:
        message = ("error", "error", f"{type(exc).__name__}: {exc}")
    try:
        conn.send(message)
    except BaseException:  # the parent has gone, or the result cannot be sent: exit anyway
        os._exit(3)
    finally:
        conn.close()


class PoolSolve(Generic[R]):
    """One solve submitted to the pool: `future` holds its result, or raises its
    `SolveFailedError` or `SolveCancelledError`."""

    def __init__(self, pool: SolvePool, name: str, timeout_s: float) -> None:
        self._pool = pool
        self.name = name
        self.timeout_s = timeout_s
        self.future: Future[R] = Future()
        self.submitted_at = time.monotonic()
        self.started_at: float | None = None
        """When its process started (None: waiting for its turn)."""
        self.seconds: float | None = None
        """How long its process ran (None: not ended)."""
        self._proc: multiprocessing.process.BaseProcess | None = None
        self._cancelled = False
        self._lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        """The process running the solve (None: not started, or none any more)."""
        proc = self._proc
        return None if proc is None else proc.pid

    def done(self) -> bool:
        return self.future.done()

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        """Stop the solve: take it out of the queue, or kill its process. Returns at once
        (safe on the event loop); `future` ends with `SolveCancelledError` soon after."""
        with self._lock:
            if self._cancelled or self.future.done():
                return
            self._cancelled = True
            proc = self._proc
        if proc is not None:
            with contextlib.suppress(OSError, ValueError, AttributeError):  # already gone
                proc.kill()
        with self._pool._cond:
            self._pool._cond.notify_all()  # a queued solve leaves the queue now


class SolvePool:
    """Solves in processes of their own, at most `workers` at once (module docstring)."""

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"a solve pool needs at least one worker, got {workers}")
        self._workers = workers
        self._ctx = _context()
        self._cond = threading.Condition()
        self._running = 0
        self._queue: deque[PoolSolve[Any]] = deque()
        self._live: set[PoolSolve[Any]] = set()

    @property
    def workers(self) -> int:
        """Solves that run at once; more wait their turn."""
        return self._workers

    @workers.setter
    def workers(self, value: int) -> None:
        if value < 1:
            raise ValueError(f"a solve pool needs at least one worker, got {value}")
        with self._cond:
            self._workers = value
            self._cond.notify_all()

    @property
    def running(self) -> int:
        """Solves whose process runs now."""
        return self._running

    @property
    def queued(self) -> int:
        """Solves waiting for their turn."""
        return len(self._queue)

    def submit(
        self,
        fn: Callable[[A], R],
        arg: A,
        *,
        name: str,
        timeout_s: float,
        memory_bytes: int | None = None,
    ) -> PoolSolve[R]:
        """Run ``fn(arg)`` in a process of its own when a worker is free. `fn` must be a
        module-level function and `arg` picklable (both go to the new process); its result,
        picklable too, should be small (the solve's files are how big results travel).
        `timeout_s` counts from the process's start; `memory_bytes`: how much it may grow
        (`SolveFailedError` ``memory`` beyond)."""
        solve: PoolSolve[R] = PoolSolve(self, name, timeout_s)
        with self._cond:
            self._queue.append(solve)
            self._live.add(solve)
        threading.Thread(
            target=self._supervise,
            args=(solve, fn, arg, memory_bytes),
            name=f"perseus-solve {name}",
            daemon=True,
        ).start()
        return solve

    def cancel_all(self) -> None:
        """Cancel every queued and running solve."""
        with self._cond:
            live = list(self._live)
        for solve in live:
            solve.cancel()

    def _supervise(
        self,
        solve: PoolSolve[Any],
        fn: Callable[[Any], Any],
        arg: Any,
        memory_bytes: int | None,
    ) -> None:
        try:
            with self._cond:
                while not solve.cancelled and (
                    self._queue[0] is not solve or self._running >= self._workers
                ):
                    self._cond.wait()
                self._queue.remove(solve)
                if solve.cancelled:
                    self._cond.notify_all()
                    solve.future.set_exception(SolveCancelledError(f"{solve.name}: cancelled"))
                    return
                self._running += 1
                self._cond.notify_all()
            try:
                self._run(solve, fn, arg, memory_bytes)
            finally:
                with self._cond:
                    self._running -= 1
                    self._cond.notify_all()
        except BaseException as exc:  # never leave a future pending
            if not solve.future.done():
                solve.future.set_exception(
                    SolveFailedError(
                        "error", f"the solve could not run: {type(exc).__name__}: {exc}"
                    )
                )
        finally:
            with self._cond:
                self._live.discard(solve)

    def _run(
        self,
        solve: PoolSolve[Any],
        fn: Callable[[Any], Any],
        arg: Any,
        memory_bytes: int | None,
    ) -> None:
        recv, send = self._ctx.Pipe(duplex=False)
        proc = self._ctx.Process(  # type: ignore[attr-defined]
            target=_child,
            args=(fn, arg, send, memory_bytes, os.getpid()),
            name=solve.name,
            daemon=True,
        )
        with solve._lock:
            if solve.cancelled:
                recv.close()
                send.close()
                solve.future.set_exception(SolveCancelledError(f"{solve.name}: cancelled"))
                return
            try:
                proc.start()
            except BaseException:
                recv.close()
                send.close()
                raise
            solve._proc = proc
            solve.started_at = time.monotonic()
        send.close()
        message: tuple[Any, ...] | None = None
        timed_out = False
        deadline = solve.started_at + solve.timeout_s
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                ready = multiprocessing.connection.wait([recv, proc.sentinel], timeout=left)
                if recv in ready or (ready and recv.poll()):
                    try:
                        message = recv.recv()
                    except (EOFError, OSError):
                        message = None  # it died without a word
                    break
                if ready:  # the process ended without sending anything
                    break
        finally:
            recv.close()
        if timed_out or solve.cancelled:
            proc.kill()
        proc.join(_JOIN_S)
        if proc.is_alive():
            proc.kill()
            proc.join()
        solve.seconds = time.monotonic() - solve.started_at
        solve._proc = None
        exitcode = proc.exitcode
        proc.close()
        if solve.cancelled:
            solve.future.set_exception(SolveCancelledError(f"{solve.name}: cancelled"))
        elif timed_out:
            solve.future.set_exception(
                SolveFailedError(
                    "timeout",
                    f"it ran longer than {solve.timeout_s:g} s (PERSEUS_SOLVE_TIMEOUT_S) and "
                    "was stopped",
                )
            )
        elif message is not None and message[0] == "ok":
            solve.future.set_result(message[1])
        elif message is not None:
            solve.future.set_exception(SolveFailedError(message[1], message[2]))
        else:
            how = (
                f"was killed by signal {-exitcode}"
                if exitcode is not None and exitcode < 0
                else f"exited with code {exitcode}"
            )
            hint = " (the out-of-memory killer?)" if exitcode == -9 else ""
            solve.future.set_exception(
                SolveFailedError("crashed", f"its process {how} without an answer{hint}")
            )


_POOL: SolvePool | None = None
_POOL_LOCK = threading.Lock()


def solve_pool(workers: int) -> SolvePool:
    """The coordinator process's pool, made on first use, running at most `workers` solves
    at once (the latest caller's number: every job of a coordinator has the same)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = SolvePool(workers)
        elif _POOL.workers != workers:
            _POOL.workers = workers
        return _POOL
