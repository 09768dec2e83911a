"""End to end: a torchrun job survives ``kill -9`` of its coordinator, guard included.

A real 2-rank torchrun job (gloo, emulated GPUs in nominal mode) under `Perseus` profiles,
deploys its plan and has it checked. The coordinator is then SIGKILLed and started again
on the same port and dump dir; meanwhile the ranks wait at a round boundary, reconnect, and
the restored coordinator serves the same plan, its guard re-armed, until the job finishes,
exit status 0.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from e2e_fixtures import Coordinator, DemoJob, require_torch, run_job

from perseus.io.jobdir import JobDir

require_torch()


def _wait_for(predicate, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


def _promise(jd: JobDir) -> list[dict]:
    path = jd.promise
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def test_the_guard_checks_the_plan_again_after_kill_9_and_the_job_finishes(tmp_path):
    """Issue 49: a torchrun job under `Perseus` profiles, deploys and has its plan checked by
    the guard; then the coordinator is SIGKILLed and started again on the same dump. The
    restarted coordinator re-arms the guard from ``guard.json`` (``resumed``), the guard
    checks the plan again, and the job ends ``finished``. The emulated counter refreshes
    every 20 ms (not the 100 ms default: sensors are not under test here), so that profiling
    rounds are short."""
    coordinator = Coordinator(
        scheduler="Perseus",
        scheduler_args={"max_slowdown": 0.05},
        dump_dir=tmp_path / "dump",
        log_path=tmp_path / "coordinator.log",
        env={"PERSEUS_DUMP_DATA": "1"},
    )
    spec = DemoJob(
        nproc=2,
        layers="1,3",
        microbatches=2,
        steps=200,
        nominal_ms_per_layer=10.0,
        env={"PERSEUS_RECONNECT_S": "60", "ZEUS_EMULATED_SENSOR_PERIOD_MS": "20"},
    )
    outcome: list = []
    with coordinator:
        training = threading.Thread(
            target=lambda: outcome.append(run_job(tmp_path, spec, coordinator, timeout_s=300))
        )
        training.start()

        def job_dir():
            dirs = coordinator.job_dirs()
            return JobDir(dirs[0]) if dirs else None

        def checked() -> bool:
            jd = job_dir()
            return jd is not None and any(e["event"] == "check" for e in _promise(jd))

        _wait_for(checked, 300, "the guard's first check of the deployed plan")
        jd = job_dir()
        assert jd is not None
        before = _promise(jd)
        assert next(e["event"] for e in before if e["event"] != "profile_left_out") == "deployed"
        plan_before = jd.deployed_plan.read_text()
        coordinator.kill()
        time.sleep(2.0)  # the ranks wait for it
        coordinator.start()  # same port, same dump dir
        training.join(timeout=300)
    status, traces, log = outcome[0]
    assert status == 0, log[-4000:]
    after = _promise(jd)[len(before) :]
    events = [e["event"] for e in after]
    assert events and events[0] == "resumed", after
    assert "check" in events[1:], after  # the guard checked the plan again
    assert not [e for e in after if e["event"] in ("held", "fallback")], after
    # The restored coordinator serves the plan it had: no new solve. The guard may still move
    # to a faster frontier point if a loaded host stretches the plan's rounds past the budget
    # (CI's two shared cores did): then the file holds that move's plan.
    assert "deployed" not in events, after
    moves = [e for e in after if e["event"] == "move"]
    plan_now = jd.deployed_plan.read_text()
    if not moves:
        assert plan_now == plan_before
    else:
        assert json.loads(plan_now)["energy"] == pytest.approx(moves[-1]["energy_j"])
    assert (jd.path / "finished").is_file() and not (jd.path / "failed").exists()
    assert "the coordinator is back" in log
    for rank in (0, 1):
        assert len([r for r in traces[rank] if r["kind"] == "step"]) == spec.steps
