"""End to end: failures end the job with our error message, never a hang.

The ranks run as plain processes (not under torchrun, whose agent would tear the group
down and print its own report), so each one's stderr is what its user would see.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest
from e2e_fixtures import Coordinator, DemoJob, launch_ranks, require_torch

from perseus.demo import count_steps, free_port

require_torch()


def _finish(procs, timeout_s):
    """Wait for every process; returns [(returncode, stderr)] (kills stragglers at the end)."""
    deadline = time.monotonic() + timeout_s
    out = []
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            out.append((None, err))
            continue
        out.append((proc.returncode, err))
    return out


def test_unreachable_coordinator_fails_every_rank_naming_the_url(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    # The ranks wait PERSEUS_RECONNECT_S for a coordinator (a restart), then fail.
    spec = DemoJob(nproc=2, layers="1,3", microbatches=2, steps=2, env={"PERSEUS_RECONNECT_S": "2"})
    procs = launch_ranks(spec, url, tmp_path / "trace", master_port=free_port())
    (rc0, err0), (rc1, err1) = _finish(procs, 60)
    assert rc0 == 1 and rc1 == 1, (err0, err1)
    assert "(retried for 2 s, PERSEUS_RECONNECT_S=2)" in err0
    assert (
        f"perseus.train rank 0: error: CoordinatorUnreachableError: Cannot reach the Perseus coordinator at {url}"
        in err0
    )
    assert (
        "perseus.train rank 1: error: CoordinatorError: Rank 0 could not register the job: "
        f"Cannot reach the Perseus coordinator at {url}"
    ) in err1
    assert "Traceback" not in err0 + err1


def _last_record(path):
    lines = path.read_text().splitlines() if path.exists() else []
    return json.loads(lines[-1]) if lines else {}


@pytest.mark.parametrize(
    ("when", "expected"),
    [
        # Killed inside a step: its pipeline neighbours see the P2P connection drop.
        ("mid-step", ("lost its pipeline peers", "probably died")),
        # Killed between two rounds: the others wait at the coordinator's barrier, which
        # times out and names the rank that never asked.
        ("between-rounds", ("504", "rank(s) [2] never asked for their schedule")),
        # Frozen inside a step (SIGSTOP): its neighbour's receive times out (--pg-timeout).
        ("hung-mid-step", ("lost its pipeline peers", "died or hung")),
    ],
)
def test_a_dying_rank_fails_the_others_within_the_timeout(tmp_path, when, expected):
    round_timeout_s, pg_timeout_s = 5.0, 5.0
    spec = DemoJob(
        nproc=3,
        layers="1,2,1",
        microbatches=3,  # torch's 1F1B needs at least as many microbatches as stages
        steps=500,
        round_timeout_s=30.0,
        pg_timeout_s=pg_timeout_s,
    )
    with Coordinator(
        scheduler="AllMaxFrequency",
        dump_dir=tmp_path / "dump",
        log_path=tmp_path / "coordinator.log",
        round_timeout_s=round_timeout_s,
    ) as coordinator:
        trace = tmp_path / "trace"
        procs = launch_ranks(spec, coordinator.url, trace, master_port=free_port())
        deadline = time.monotonic() + 90
        while True:
            assert time.monotonic() < deadline, "the job never got going"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            if count_steps(trace, rank=2) >= 3:
                last = _last_record(trace / "rank2.jsonl")
                if (
                    when.endswith("mid-step")
                    and last.get("kind") == "instruction"
                    and last["index"] == 0
                ):
                    break
                if when == "between-rounds" and last.get("kind") == "step":
                    break
            time.sleep(0.001)
        procs[2].send_signal(signal.SIGSTOP if when.startswith("hung") else signal.SIGKILL)
        killed_at = time.monotonic()
        results = _finish(procs[:2], round_timeout_s + pg_timeout_s + 20)
        elapsed_s = time.monotonic() - killed_at
        procs[2].kill()  # also ends a stopped process
        procs[2].communicate()
    assert elapsed_s < max(round_timeout_s, pg_timeout_s) + 5
    for rank, (rc, err) in enumerate(results):
        assert rc == 1, (rank, err)
        line = next(
            x for x in err.splitlines() if x.startswith(f"perseus.train rank {rank}: error:")
        )
        assert all(part in line for part in expected), line
        assert "Traceback" not in err
    # Rank 1's message names rank 2: as one of its pipeline peers (torch's schedule does not
    # say which receive failed), or as the rank that never asked for its schedule.
    assert "(ranks [0, 2])" in results[1][1] or "[2]" in results[1][1]
