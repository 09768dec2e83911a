"""A restarted coordinator on the same dump_dir serves a job's deployed plan again."""

from __future__ import annotations

import time

import httpx
from server_fixtures import F_MAX, FREQS, GroundTruth, SimulatedJob, running_server, stage_freqs

from perseus.domain.plan import Plan
from perseus.domain.schedule import make_schedule
from perseus.io.plan_file import save_plan
from perseus.settings import PerseusSettings

M = 3
ROUNDS = 12  # the sweep's 10 levels, the plan from round 10


def perseus_settings(tmp_path, **kw) -> PerseusSettings:
    return PerseusSettings(
        scheduler="Perseus",
        # Not about the all-max baseline: deployed once the (short) sweep is done.
        scheduler_args={
            "num_microbatches": M,
            "freq_step": 3,
            "min_frequency": 1000,
            "warmup_rounds": 0,
            "baseline_rounds": 0,
        },
        dump_dir=str(tmp_path / "dump"),
        **{"dump_data": True, **kw},
    )


def test_a_restarted_coordinator_resumes_the_deployed_plan(tmp_path):
    truth = GroundTruth([0.010, 0.015, 0.011])
    with running_server(perseus_settings(tmp_path)) as url:
        job = SimulatedJob(url, truth, pp=3, dp=2, num_microbatches=M)
        job.run_sync(ROUNDS)
    deployed = job.history[-1]
    assert deployed == job.history[-2]
    assert any(set(stage_freqs(deployed, r)) != {F_MAX} for r in deployed), "not all-max"
    job_dir = tmp_path / "dump" / job.job_id
    rounds_before = sorted(int(p.name.split(".")[0]) for p in job_dir.glob("*.sched.json"))

    with running_server(perseus_settings(tmp_path)) as url:
        job.base_url = url
        job.run_sync(2)  # the same ranks of the same job keep asking
        assert job.history[-1] == deployed and job.history[-2] == deployed
        # The restored job still has its frontier: a straggler changes the other pipeline.
        r = httpx.post(f"{url}/straggler/{job.job_id}", json={"dp_rank": 0, "slowdown": 1.2})
        assert r.status_code == 200, r.text
        job.run_sync(1)
    dp1 = [i.rank for i in job.infos if i.dp_rank == 1]
    assert all(job.history[-1][r] != deployed[r] for r in dp1)
    rounds_after = sorted(int(p.name.split(".")[0]) for p in job_dir.glob("*.sched.json"))
    # Round numbers continue, nothing is overwritten, and the last 10 rounds are kept, with
    # the all-max rounds the energy report measures its baseline from (the restarted
    # coordinator found them in the dump and kept protecting them).
    all_max = [
        n for n, h in enumerate(job.history) if all(set(stage_freqs(h, r)) == {F_MAX} for r in h)
    ]
    assert all_max and all_max[0] < rounds_after[-10]
    last = [*rounds_before, ROUNDS, ROUNDS + 1, ROUNDS + 2][-10:]
    assert rounds_after == sorted({*last, *all_max[-10:]})


def make_plan(num_stages: int, freq_of: dict[str, int]) -> Plan:
    kinds = make_schedule("1f1b", num_stages, M).kinds()
    return Plan(
        schedule="1f1b",
        num_stages=num_stages,
        num_microbatches=M,
        p2p_power=70.0,
        iteration_time=1.0,
        energy=1.0,
        frequencies=[[(k, freq_of[k]) for k in ks] for ks in kinds],
    )


def test_point_solution_job_resumes_its_plan_and_evicted_jobs_stay_gone(tmp_path):
    truth = GroundTruth([0.01, 0.01])
    plan_path = tmp_path / "plan.json"
    save_plan(make_plan(2, {"forward": 1200, "backward": 975}), plan_path)
    settings = PerseusSettings(
        scheduler="PointSolution",
        scheduler_args={"solution_path": str(plan_path)},
        dump_dir=str(tmp_path / "dump"),
        dump_data=True,
        max_job_idle_time=1,
    )
    with running_server(settings) as url:
        kept = SimulatedJob(url, truth, pp=2, num_microbatches=M)
        kept.run_sync(1)
        idle = SimulatedJob(url, truth, pp=2, num_microbatches=M)
        idle.run_sync(1)
        for _ in range(10):  # `kept` stays active, `idle` gets evicted
            time.sleep(0.25)
            httpx.get(f"{url}/schedule/{kept.job_id}", params={"rank": 5})  # 422, but activity
        assert httpx.get(f"{url}/schedule/{idle.job_id}", params={"rank": 0}).status_code == 404
    assert (tmp_path / "dump" / idle.job_id / "evicted").is_file()
    # The plan file changes; the restored job keeps the plan it had deployed.
    save_plan(make_plan(2, {"forward": F_MAX, "backward": F_MAX}), plan_path)
    with running_server(settings) as url:
        r = httpx.get(f"{url}/schedule/{idle.job_id}", params={"rank": 0})
        assert r.status_code == 404
        kept.base_url = url
        kept.run_sync(1)
    assert kept.history[-1] == kept.history[0]
    assert set(stage_freqs(kept.history[-1], 0)) == {1200, 975}


def test_nothing_is_restored_without_dump_data(tmp_path):
    truth = GroundTruth([0.01])
    with running_server(perseus_settings(tmp_path)) as url:
        job = SimulatedJob(url, truth, pp=1, num_microbatches=M)
        job.run_sync(1)
    with running_server(perseus_settings(tmp_path, dump_data=False)) as url:
        assert httpx.get(f"{url}/schedule/{job.job_id}", params={"rank": 0}).status_code == 404


def test_a_restored_profiler_job_whose_profile_exists_runs_at_max(tmp_path):
    settings = PerseusSettings(
        scheduler="InstructionProfiler",
        scheduler_args={
            "num_microbatches": M,
            "warmup_rounds": 0,
            "freq_step": 5,
            "min_frequency": FREQS[10],
        },
        dump_dir=str(tmp_path / "dump"),
        dump_data=True,
    )
    with running_server(settings) as url:
        job = SimulatedJob(url, GroundTruth([0.01, 0.01]), pp=2, num_microbatches=M)
        job.run_sync(5)
    assert [stage_freqs(h, 0)[0] for h in job.history] == [F_MAX, FREQS[5], FREQS[10], F_MAX, F_MAX]
    csv = tmp_path / "dump" / job.job_id / "instruction_profile.csv"
    written = csv.read_text()
    with running_server(settings) as url:
        job.base_url = url
        job.run_sync(2)
    assert [stage_freqs(h, 0)[0] for h in job.history[-2:]] == [F_MAX, F_MAX]
    assert csv.read_text() == written
