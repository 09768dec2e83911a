"""Recovery from a coordinator restart (issue 30, item 4).

A real coordinator (a `perseus serve` subprocess, or uvicorn in a thread where only the
dump matters) is killed with SIGKILL and started again on the same port and dump dir; the
ranks are real `CoordinatorClient`s that retry through the outage. Dumps it must not
trust are refused, failed jobs stay failed, old rounds are pruned and a round's results
are on disk as soon as the last one arrives.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from server_fixtures import GroundTruth, SimulatedJob, running_server

from perseus.client.wire.coordinator import CoordinatorClient
from perseus.demo import Coordinator
from perseus.domain.plan import Plan
from perseus.domain.schedule import make_schedule
from perseus.io.jobdir import JobDir
from perseus.io.plan_file import save_plan
from perseus.planning.report import REPORT_WINDOW
from perseus.protocol import FrequencySchedule, load_prof
from perseus.settings import PerseusSettings

M = 3
TRUTH = GroundTruth([0.01, 0.012])


def write_plan(path: Path) -> Path:
    kinds = make_schedule("1f1b", 2, M).kinds()
    freq = {"forward": 1200, "backward": 975}
    plan = Plan(
        schedule="1f1b",
        num_stages=2,
        num_microbatches=M,
        p2p_power=70.0,
        iteration_time=1.0,
        energy=1.0,
        frequencies=[[(k, freq[k]) for k in ks] for ks in kinds],
    )
    save_plan(plan, path)
    return path


def point_settings(tmp_path: Path, **kw: object) -> PerseusSettings:
    return PerseusSettings(
        scheduler="PointSolution",
        scheduler_args={"solution_path": str(write_plan(tmp_path / "plan.json"))},
        dump_dir=str(tmp_path / "dump"),
        **{"dump_data": True, **kw},
    )


def test_ranks_carry_on_through_a_kill_9_and_a_restart_on_the_same_dump(tmp_path: Path) -> None:
    settings = point_settings(tmp_path)
    coordinator = Coordinator(
        scheduler=settings.scheduler,
        scheduler_args=settings.scheduler_args,
        dump_dir=settings.dump_dir,
        log_path=tmp_path / "coordinator.log",
        env={"PERSEUS_DUMP_DATA": "1"},
    )
    with coordinator:
        job = SimulatedJob(coordinator.url, TRUTH, pp=2, num_microbatches=M)
        job.run_sync(2)
        job_dir = JobDir.of(settings.dump_dir, job.job_id or "")
        plan_before = job_dir.deployed_plan.read_text()
        # The last round's results are on disk although no later round has started.
        assert [r.iter_time for r in load_prof(job_dir.path, 1)] == [
            r.iter_time for r in job.results[-1]
        ]
        got: dict[int, FrequencySchedule] = {}
        clients = {r: CoordinatorClient(coordinator.url, reconnect_s=60) for r in (0, 1)}

        def ask(rank: int) -> None:
            got[rank] = clients[rank].get_schedule(job.job_id or "", rank, timeout_s=60)

        waiting = threading.Thread(target=ask, args=(0,))
        waiting.start()  # rank 0 waits in round 2's barrier ...
        time.sleep(0.5)
        coordinator.kill()  # ... when the coordinator dies
        killed_at = time.monotonic()
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{coordinator.url}/info")
        time.sleep(1.0)
        coordinator.start()  # same port, same dump dir
        restarted_s = time.monotonic() - killed_at
        ask(1)  # rank 1 asks the restored coordinator; rank 0 has reconnected meanwhile
        waiting.join(timeout=30)
        for client in clients.values():
            client.close()
    # Restarted 1 s after the kill; the new process answers after its start-up (a few s,
    # about 10 on a loaded 2-core machine): the ranks waited that long.
    assert restarted_s > 1.0
    assert clients[0].retries >= 1, "rank 0's request went through the outage"
    assert got == job.history[-1] == job.history[0], "the same plan after the restart"
    assert job_dir.deployed_plan.read_text() == plan_before
    assert job_dir.schedules(2).is_file(), "round numbers continue"


@pytest.fixture
def evil_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An importable module that leaves a mark if anything imports it."""
    marker = tmp_path / "imported"
    (tmp_path / "evil_plugin.py").write_text(
        f"open({str(marker)!r}, 'w').write('imported')\nclass Evil: pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return marker


def test_dumps_it_cannot_trust_are_refused_with_a_warning(
    tmp_path: Path, evil_plugin: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = point_settings(tmp_path)
    with running_server(settings) as url:
        jobs = [SimulatedJob(url, TRUTH, pp=2, num_microbatches=M) for _ in range(8)]
        for job in jobs:
            job.run_sync(1)
    bad = [JobDir.of(settings.dump_dir, job.job_id or "") for job in jobs[1:]]
    bad[0].scheduler.unlink()
    bad[1].scheduler.write_text('{"scheduler": "PointSolution", ')
    bad[2].scheduler.write_text(json.dumps({"scheduler": "evil_plugin:Evil"}))
    bad[3].scheduler.write_text(json.dumps({"scheduler": "AllMaxFrequency"}))
    bad[4].job.write_text(bad[4].job.read_text()[:-20])
    bad[5].ranks.write_text("[{}]")
    bad[6].deployed_plan.write_text('{"schedule": "1f1b"}')
    files_before = {p: p.read_bytes() for d in bad for p in d.path.iterdir() if p.is_file()}
    reasons = [
        "scheduler.json is missing",
        "scheduler.json is not valid JSON",
        "names scheduler 'evil_plugin:Evil'",
        "names scheduler 'AllMaxFrequency'",
        "job.json is not a valid job record",
        "ranks.json is not valid",
        "deployed_plan.json is not a valid plan",
    ]
    with caplog.at_level(logging.WARNING), running_server(settings) as url:
        jobs[0].base_url = url
        jobs[0].run_sync(1)  # the intact job is back, the others are not
        for job_dir in bad:
            r = httpx.get(f"{url}/schedule/{job_dir.name}", params={"rank": 0})
            assert r.status_code == 404, job_dir.name
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for job_dir, reason in zip(bad, reasons, strict=True):
        assert any(job_dir.name in w and reason in w for w in warnings), (reason, warnings)
    assert not evil_plugin.exists() and "evil_plugin" not in sys.modules, "never imported"
    assert {p: p.read_bytes() for p in files_before} == files_before, "left as it is"


def test_a_failed_job_stays_failed_after_a_restart(tmp_path: Path) -> None:
    settings = point_settings(tmp_path)
    with running_server(settings, round_timeout_s=0.5) as url:
        job = SimulatedJob(url, TRUTH, pp=2, num_microbatches=M)
        job.run_sync(1)
        r = httpx.get(f"{url}/schedule/{job.job_id}", params={"rank": 0})  # rank 1 never asks
        assert r.status_code == 504
        assert httpx.get(f"{url}/schedule/{job.job_id}", params={"rank": 1}).status_code == 409
    job_dir = JobDir.of(settings.dump_dir, job.job_id or "")
    assert "timed out" in job_dir.failed.read_text()
    with running_server(settings) as url:
        r = httpx.get(f"{url}/schedule/{job.job_id}", params={"rank": 0})
        assert r.status_code == 404, "not brought back to life"


ROUNDS = REPORT_WINDOW + 4


@pytest.mark.parametrize(
    ("keep", "kept"),
    [
        # The last 3 rounds, and the newest REPORT_WINDOW + 1 rounds of the deployed plan
        # (every round of a PointSolution job runs its plan), which the report is made from.
        (3, list(range(ROUNDS - REPORT_WINDOW - 1, ROUNDS))),
        (0, list(range(ROUNDS))),
    ],
)
def test_old_rounds_are_pruned_and_the_last_results_are_written(
    tmp_path: Path, keep: int, kept: list[int]
) -> None:
    settings = point_settings(tmp_path, dump_keep_rounds=keep)
    with running_server(settings) as url:
        job = SimulatedJob(url, TRUTH, pp=2, num_microbatches=M)
        job.run_sync(ROUNDS)
        job_dir = JobDir.of(settings.dump_dir, job.job_id or "")
        names = {p.name for p in job_dir.path.iterdir()}
    assert sorted(int(n.split(".")[0]) for n in names if n.endswith(".sched.json")) == kept
    assert sorted(int(n.split(".")[0]) for n in names if n.endswith(".prof.json")) == kept
    last = ROUNDS - 1
    assert load_prof(job_dir.path, last) == job.results[-1], "the last round's results, on arrival"


def test_ranks_registered_before_a_restart_stay_registered(tmp_path: Path) -> None:
    settings = point_settings(tmp_path)
    job, other = (SimulatedJob("", TRUTH, pp=2, num_microbatches=M) for _ in range(2))
    with running_server(settings) as url:
        for j in (job, other):
            j.base_url = url
            j.job_id = httpx.post(f"{url}/register_job", json=j.info.model_dump()).json()
            r = httpx.post(f"{url}/register_rank/{j.job_id}", json=j.infos[0].model_dump())
            assert r.status_code == 200
    partial = JobDir.of(settings.dump_dir, job.job_id or "").registering
    assert len(partial.read_text().splitlines()) == 1
    with partial.open("a") as f:  # rank 1's line was being written when it was killed
        f.write(job.infos[1].model_dump_json()[:30])
    other_partial = JobDir.of(settings.dump_dir, other.job_id or "").registering
    other_partial.write_text(other_partial.read_text() * 2)  # rank 0 twice: not ours
    with running_server(settings) as url:
        job.base_url = url
        for info in job.infos:  # rank 0 retries (its answer was lost), rank 1 registers
            r = httpx.post(f"{url}/register_rank/{job.job_id}", json=info.model_dump())
            assert r.status_code == 200, r.text
        schedules = asyncio.run(_ask_all(job))
        assert sorted(schedules) == [0, 1]
        r = httpx.post(f"{url}/register_rank/{other.job_id}", json=other.infos[1].model_dump())
        assert r.status_code == 404, "a dump with a rank twice is refused"
    assert not partial.exists() and JobDir.of(settings.dump_dir, job.job_id or "").ranks.is_file()


async def _ask_all(job: SimulatedJob) -> dict[int, FrequencySchedule]:
    async with httpx.AsyncClient(timeout=30) as client:
        return await job.ask_all(client)
