"""End to end: a torchrun job survives ``kill -9`` of its coordinator (issue 30, item 4).

A real 2-rank torchrun job (gloo, emulated GPUs in nominal mode) runs `PointSolution`'s
plan. Mid-job the coordinator is SIGKILLed and started again within 10 s on the same
port and dump dir; meanwhile the ranks wait at a round boundary, reconnect, and the
restored coordinator serves the same plan until the job finishes, exit status 0.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from e2e_fixtures import Coordinator, DemoJob, executed, require_torch, run_job

from perseus.domain.plan import Plan
from perseus.domain.schedule import make_schedule
from perseus.io.jobdir import JobDir
from perseus.io.plan_file import load_plan, save_plan

require_torch()

FREQS = [[1410, 1005, 705, 1200], [810, 1395, 1110, 600]]


def _plan(path):
    schedule = make_schedule("1f1b", 2, 2)
    plan = Plan(
        schedule="1f1b",
        num_stages=2,
        num_microbatches=2,
        p2p_power=55.0,
        iteration_time=1.0,
        energy=1.0,
        frequencies=[
            [(i.kind, f) for i, f in zip(order, fs, strict=True)]
            for order, fs in zip(schedule.orders, FREQS, strict=True)
        ],
    )
    save_plan(plan, path)
    return path


def _wait_for(predicate, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_a_job_survives_kill_9_of_its_coordinator_and_a_restart(tmp_path):
    plan_path = _plan(tmp_path / "plan.json")
    coordinator = Coordinator(
        scheduler="PointSolution",
        scheduler_args={"solution_path": str(plan_path)},
        dump_dir=tmp_path / "dump",
        log_path=tmp_path / "coordinator.log",
        env={"PERSEUS_DUMP_DATA": "1"},
    )
    spec = DemoJob(
        nproc=2,
        layers="1,3",
        microbatches=2,
        steps=80,
        nominal_ms_per_layer=10.0,
        env={"PERSEUS_RECONNECT_S": "60"},
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

        _wait_for(lambda: job_dir() is not None and len(job_dir().rounds()) >= 3, 180, "round 3")
        jd = job_dir()
        plan_before = jd.deployed_plan.read_text()
        coordinator.kill()
        killed_at = time.monotonic()
        last_round_before = jd.rounds()[-1]
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{coordinator.url}/info")
        time.sleep(2.0)  # the ranks wait for it
        coordinator.start()  # same port, same dump dir
        restarted_after_s = time.monotonic() - killed_at
        training.join(timeout=300)
    # Restarted 2 s after the kill; the new process answers after its start-up (a few s,
    # about 10 on a loaded 2-core machine): the ranks waited that long.
    assert restarted_after_s > 2.0
    status, traces, log = outcome[0]
    assert status == 0, log
    # The restored coordinator served later rounds, with the plan it had deployed.
    assert jd.rounds()[-1] > last_round_before
    assert jd.deployed_plan.read_text() == plan_before
    plan = load_plan(plan_path)
    for rank in (0, 1):
        steps = [r for r in traces[rank] if r["kind"] == "step"]
        assert len(steps) == spec.steps
        for s in steps:  # every step ran the plan, before and after the restart
            assert executed(traces[rank], s["step"]) == [tuple(x) for x in plan.frequencies[rank]]
    assert "the coordinator is back" in log
