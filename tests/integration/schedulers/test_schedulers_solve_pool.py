"""The coordinator's solve pool (`perseus.schedulers.perseus_scheduler.solve_pool`): every solve in a process of its
own, a bounded number at once; what goes wrong in one comes back as a `SolveFailedError`
of its kind, and a cancelled or timed-out solve's process is gone.

The functions the pool runs are module-level (the pool sends them to a new process by
name), real ones: they raise, run out of memory, die or sleep.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from perseus.schedulers.perseus_scheduler.solve_pool import (
    SolveCancelledError,
    SolveFailedError,
    SolvePool,
)

WAIT_S = 30.0


def _raises(text: str) -> None:
    raise ValueError(text)


def _allocates(n_bytes: int) -> int:
    return len(bytearray(n_bytes))


def _dies(_: object) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _sleeps(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def _answers(value: int) -> dict[str, int]:
    return {"value": value, "pid": os.getpid()}


def _gone(pid: int) -> bool:
    """Whether process `pid` has ended (it is no child of ours any more, or a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().split(") ", 1)[1].startswith("Z")
    except OSError:
        return True


def _started(solve, timeout_s: float = WAIT_S) -> int:
    deadline = time.monotonic() + timeout_s
    while solve.pid is None:
        assert time.monotonic() < deadline, "the solve's process never started"
        time.sleep(0.01)
    return solve.pid


@pytest.fixture
def pool() -> SolvePool:
    pool = SolvePool(2)
    yield pool
    pool.cancel_all()


def test_a_solve_runs_in_another_process_and_answers(pool):
    answer = pool.submit(_answers, 7, name="answers", timeout_s=WAIT_S).future.result(WAIT_S)
    assert answer["value"] == 7 and answer["pid"] != os.getpid()


def test_what_goes_wrong_in_a_solve_comes_back_as_its_kind(pool):
    raised = pool.submit(_raises, "no plan", name="raises", timeout_s=WAIT_S)
    with pytest.raises(SolveFailedError, match="ValueError: no plan") as info:
        raised.future.result(WAIT_S)
    assert info.value.kind == "error"

    # A real MemoryError: the process may grow by 64 MiB and asks for 4 GiB.
    hungry = pool.submit(
        _allocates, 4 * 2**30, name="hungry", timeout_s=WAIT_S, memory_bytes=64 * 2**20
    )
    with pytest.raises(SolveFailedError) as info:
        hungry.future.result(WAIT_S)
    assert info.value.kind == "memory"

    died = pool.submit(_dies, None, name="dies", timeout_s=WAIT_S)
    with pytest.raises(SolveFailedError, match="killed by signal 9") as info:
        died.future.result(WAIT_S)
    assert info.value.kind == "crashed"


def test_a_solve_past_its_time_is_stopped(pool):
    solve = pool.submit(_sleeps, 60.0, name="slow", timeout_s=0.5)
    pid = _started(solve)
    with pytest.raises(SolveFailedError, match=r"longer than 0\.5 s") as info:
        solve.future.result(WAIT_S)
    assert info.value.kind == "timeout"
    assert _gone(pid)


def test_a_cancelled_solve_s_process_is_gone_and_a_queued_one_never_starts(pool):
    pool.workers = 1
    running = pool.submit(_sleeps, 60.0, name="running", timeout_s=120.0)
    pid = _started(running)
    queued = pool.submit(_sleeps, 60.0, name="queued", timeout_s=120.0)
    third = pool.submit(_answers, 3, name="third", timeout_s=120.0)
    time.sleep(0.3)
    assert (pool.running, pool.queued) == (1, 2)  # one worker: the others wait their turn
    assert queued.pid is None and queued.started_at is None

    t0 = time.monotonic()
    queued.cancel()  # it leaves the queue without a process
    with pytest.raises(SolveCancelledError):
        queued.future.result(WAIT_S)
    assert queued.started_at is None
    running.cancel()  # returns at once; the process is killed
    assert time.monotonic() - t0 < 1.0
    with pytest.raises(SolveCancelledError):
        running.future.result(WAIT_S)
    assert _gone(pid)
    # The worker is free again: the third one runs.
    assert third.future.result(WAIT_S)["value"] == 3


def test_a_solve_ends_when_its_coordinator_is_killed(tmp_path):
    """``kill -9`` runs no clean-up in the coordinator; its solve notices within a second."""
    code = (
        "import sys, time\n"
        "from perseus.schedulers.perseus_scheduler.solve_pool import SolvePool\n"
        "solve = SolvePool(1).submit(time.sleep, 120, name='orphan', timeout_s=600)\n"
        "while solve.pid is None:\n"
        "    time.sleep(0.01)\n"
        "print(solve.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    coordinator = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        pid = int(coordinator.stdout.readline())
        assert not _gone(pid)
    finally:
        coordinator.kill()
        coordinator.wait()
        coordinator.stdout.close()
    deadline = time.monotonic() + 10
    while not _gone(pid):
        assert time.monotonic() < deadline, "the solve outlived its coordinator"
        time.sleep(0.05)
