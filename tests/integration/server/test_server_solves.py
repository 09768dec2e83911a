"""Frontier solves cannot hurt their job (`perseus.schedulers.perseus_scheduler.solving`, `perseus.schedulers.perseus_scheduler.solve_pool`).

A real coordinator on loopback runs `Perseus` with a given profile; simulated jobs on
emulated GPUs (`server_fixtures.SimulatedJob`) ask for their rounds over HTTP.

- A solve that fails (here for real: its memory re-check refuses a frontier bigger than
  ``PERSEUS_SOLVE_MEMORY_MB``) holds all-max with its reason, in ``/jobs`` (a
  ``solve_failed`` event and the hold), in ``perseus_solve_failures_total``; the job goes
  on at all-max and finishes. Before, what the solve raised failed the job and every rank.
- A solve in its own process is killed when its job finishes, is evicted or the
  coordinator shuts down.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_fixtures import (
    F_MAX,
    GroundTruth,
    SimulatedJob,
    running_server,
    stage_freqs,
    write_truth_profile,
)

from perseus.protocol import FINISH_URL
from perseus.server import create_app
from perseus.settings import PerseusSettings

TRUTH = GroundTruth([0.010, 0.016])
M = 4
WAIT_S = 60.0


def _all_max(schedules) -> bool:
    return all(set(stage_freqs(schedules, r)) == {F_MAX} for r in schedules)


def _metric(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


@pytest.mark.parametrize("where", ["process", "round"])
def test_a_solve_that_fails_holds_all_max_with_its_reason_and_the_job_finishes(
    tmp_path: Path, where: str
) -> None:
    profile = write_truth_profile(TRUTH, 2, tmp_path / "truth.csv")
    settings = PerseusSettings(
        scheduler="Perseus",
        scheduler_args={
            "num_microbatches": M,
            "max_slowdown": 0.02,
            "profile_path": str(profile),
            "p2p_power": TRUTH.p2p_power_w,
            # 0: in a process of its own; the default: in the round (16 instructions)
            **({"solve_on_thread_above": 0} if where == "process" else {}),
        },
        dump_dir=str(tmp_path / "dump"),
        solve_memory_mb=1,  # the 16 instructions' frontier is estimated at 1.6 MB
    )

    async def run(url: str) -> tuple[SimulatedJob, dict, str, int]:
        job = SimulatedJob(url, TRUTH, pp=2, num_microbatches=M)
        async with httpx.AsyncClient(timeout=WAIT_S) as client:
            await job.register(client)
            deadline = time.monotonic() + WAIT_S
            detail: dict = {}
            while time.monotonic() < deadline:
                await job.report(client, await job.ask_all(client))
                detail = (await client.get(f"{url}/jobs/{job.job_id}")).json()
                if any(e["event"] == "held" for e in detail["promise"]):
                    break
                await asyncio.sleep(0.02)
            held_at = len(job.history)
            for _ in range(3):  # the job goes on, at all-max
                await job.report(client, await job.ask_all(client))
            metrics = (await client.get(f"{url}/metrics")).text
            finished = await client.post(
                url + FINISH_URL.format(job_id=job.job_id), headers=job.headers
            )
            assert finished.status_code == 200, finished.text
            detail = (await client.get(f"{url}/jobs/{job.job_id}")).json()
        return job, detail, metrics, held_at

    with running_server(settings) as url:
        job, detail, metrics, held_at = asyncio.run(run(url))

    assert detail["state"] == "finished" and detail["failure"] is None, detail
    events = {e["event"]: e for e in detail["promise"]}
    failed = events["solve_failed"]
    assert failed["failure"] == "memory", failed
    assert "more than the 1 MiB a solve may use" in failed["reason"]
    assert "the frontier solve failed (memory)" in events["held"]["reason"]
    assert "deployed" not in events
    assert all(_all_max(h) for h in job.history), "every round ran all-max"
    assert len(job.history) >= held_at + 3
    assert _metric(metrics, "perseus_solve_failures_total", reason="memory") == 1.0
    assert _metric(metrics, "perseus_solve_failures_total", reason="timeout") == 0.0
    job_dir = tmp_path / "dump" / str(job.job_id)
    assert not list(job_dir.glob("frontier.tmp-*")), "the failed solve's files are gone"


BIG = GroundTruth([0.010, 0.012, 0.014, 0.016] * 4)
"""16 stages: a frontier of 16 × 64 microbatches takes about 4 s to solve on a quiet 2-core host."""


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().split(") ", 1)[1].startswith("Z")
    except OSError:
        return True


def _wait(predicate, what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.mark.parametrize("end", ["finish", "evict", "shutdown"])
def test_a_solve_s_process_is_killed_when_its_job_ends(tmp_path: Path, end: str) -> None:
    profile = write_truth_profile(BIG, 16, tmp_path / "truth.csv")
    settings = PerseusSettings(
        scheduler="Perseus",
        scheduler_args={
            "num_microbatches": 64,
            "profile_path": str(profile),
            "p2p_power": BIG.p2p_power_w,
            "baseline_rounds": 0,  # given everything: the solve starts at registration
            "solve_on_thread_above": 0,
        },
        dump_dir=str(tmp_path / "dump"),
        # Evicted within about 1.5 s (idle 1 s, checked every 0.5 s): well before the solve's
        # few seconds on a quiet host end it by themselves.
        max_job_idle_time=1 if end == "evict" else 3600,
    )
    app = create_app(settings)
    job = SimulatedJob("", BIG, pp=16, num_microbatches=64)

    async def register(url: str) -> None:
        job.base_url = url
        async with httpx.AsyncClient(timeout=WAIT_S) as client:
            await job.register(client)

    with running_server(settings, app=app) as url:
        asyncio.run(register(url))
        coordinated = app.state.job_manager.jobs[job.job_id]
        solve = coordinated.scheduler.deployer.solve
        assert solve is not None and solve.background
        _wait(lambda: solve.pid is not None, "the solve's process never started")
        pid = solve.pid
        assert not solve.done() and not _gone(pid)
        t0 = time.monotonic()
        if end == "finish":
            r = httpx.post(url + FINISH_URL.format(job_id=job.job_id), headers=job.headers)
            assert r.status_code == 200, r.text
        elif end == "evict":
            _wait(lambda: job.job_id not in app.state.job_manager.jobs, "never evicted", 10.0)
    # "shutdown": leaving the server's context shut the coordinator down
    _wait(lambda: _gone(pid), f"the solve's process outlived the job's {end}", 10.0)
    _wait(solve.done, "the solve never ended", 10.0)
    assert solve.cancelled and time.monotonic() - t0 < 10.0
    job_dir = tmp_path / "dump" / str(job.job_id)
    _wait(lambda: not list(job_dir.glob("frontier.tmp-*")), "the solve's files stayed", 10.0)
    assert not (job_dir / "frontier").exists()
