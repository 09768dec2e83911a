"""Protocol 2 over real HTTP: only a job's leaders talk, each for its group.

The job is a `SimulatedJob` with ``leaders_per_stage``: its every rank runs on emulated GPUs
(`VirtualCluster`), and each leader reports its group's round folded as the client folds it
in-job (`perseus.client.wire.fold.GroupFold`). The coordinator is the real app under uvicorn.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_fixtures import (
    GroundTruth,
    SimulatedJob,
    running_server,
    stage_freqs,
    write_truth_profile,
)

from perseus.io.plan_file import load_plan
from perseus.protocol import PROTOCOL_VERSION, JobInfo, RankInfo
from perseus.settings import PerseusSettings

M = 4


def _requests(url: str) -> dict[tuple[str, str], float]:
    """(route template, method) → requests answered 200."""
    text = httpx.get(f"{url}/metrics").text
    return {
        (s.labels["route"], s.labels["method"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "perseus_http_requests_total" and s.labels.get("status") == "200"
    }


def _perseus(tmp_path, **args) -> PerseusSettings:
    return PerseusSettings(
        scheduler="Perseus",
        scheduler_args={"num_microbatches": M, "baseline_rounds": 0, **args},
        dump_dir=str(tmp_path),
        dump_data=True,
    )


def test_a_16_rank_job_talks_through_its_2_leaders(tmp_path):
    """pp 2 × dp 4 × tp 2: registration is 1 + 2 requests, a round 2 + 2; /jobs says so."""
    settings = PerseusSettings(
        scheduler="AllMaxFrequency",
        scheduler_args={"num_microbatches": M},
        dump_dir=str(tmp_path),
    )
    with running_server(settings) as url:
        job = SimulatedJob(
            url,
            GroundTruth([0.01, 0.012]),
            pp=2,
            dp=4,
            tp=2,
            num_microbatches=M,
            leaders_per_stage=1,
        )
        history = job.run_sync(3)
        requests = _requests(url)
        listed = httpx.get(f"{url}/jobs").json()
    assert [i.rank for i in job.infos] == [0, 2]  # rank = (dp·pp + pp)·tp + tp
    assert requests[("/register_job", "POST")] == 1
    assert requests[("/register_rank/{job_id}", "POST")] == 2
    assert requests[("/schedule/{job_id}", "GET")] == 3 * 2
    assert requests[("/result/{job_id}", "POST")] == 3 * 2
    assert [h.keys() for h in history] == [{0, 2}] * 3
    assert listed[0]["world_size"] == 16 and listed[0]["talking_ranks"] == 2
    # Every rank's result is in the leaders' folds: 16 GPUs' energy, one pipeline's profile.
    assert all(len(r.replicas) == 4 for r in job.results[-1])


def test_a_non_leader_and_a_leader_that_misstates_its_group_are_refused_with_422(tmp_path):
    settings = PerseusSettings(scheduler="AllMaxFrequency", scheduler_args={"num_microbatches": M})
    info = JobInfo(
        pp_degree=2,
        dp_degree=2,
        tp_degree=2,
        world_size=8,
        protocol_version=PROTOCOL_VERSION,
        leaders_per_stage=1,
    )

    def rank(r: int, dp: int, pp: int, tp: int, replicas: list[int] | None) -> dict:
        return RankInfo(
            rank=r,
            dp_rank=dp,
            pp_rank=pp,
            tp_rank=tp,
            available_frequencies=[1410, 1005],
            replicas=replicas,
        ).model_dump()

    with running_server(settings) as url, httpx.Client(base_url=url) as client:
        job_id = client.post("/register_job", json=info.model_dump()).json()
        register = f"/register_rank/{job_id}"
        rule = "only the tensor-rank-0 process of data-parallel replica 0 of each pipeline stage"
        for bad in (rank(1, 0, 0, 1, [0, 1]), rank(4, 1, 0, 0, [1])):  # tp 1; replica 1
            answer = client.post(register, json=bad)
            assert answer.status_code == 422
            assert "is not a leader of job" in answer.json()["detail"]
            assert rule in answer.json()["detail"]
        answer = client.post(register, json=rank(0, 0, 0, 0, [0]))
        assert answer.status_code == 422
        assert "speaks for replicas [0-1]" in answer.json()["detail"]
        assert client.post(register, json=rank(0, 0, 0, 0, None)).status_code == 422
        # A leader registers; a rank that did not may neither ask nor report.
        assert client.post(register, json=rank(0, 0, 0, 0, [0, 1])).status_code == 200
        asked = client.get(f"/schedule/{job_id}", params={"rank": 1})
        assert asked.status_code == 422
        assert "Rank 1 is not a registered leader" in asked.json()["detail"]
        result = {"rank": 5, "iter_time": [1.0], "iter_energy": [1.0]}
        assert client.post(f"/result/{job_id}", json=result).status_code == 422
        # A protocol-1 job refuses a rank that says it speaks for others.
        old = client.post(
            "/register_job",
            json={**info.model_dump(), "protocol_version": 1, "leaders_per_stage": None},
        ).json()
        answer = client.post(f"/register_rank/{old}", json=rank(0, 0, 0, 0, [0, 1]))
        assert answer.status_code == 422 and "runs protocol 1" in answer.json()["detail"]


def test_the_leaders_replica_figures_detect_a_straggler_and_slow_the_other_pipeline(tmp_path):
    """As with every rank talking (test_schedulers_perseus): two slow rounds of pipeline 0,
    measured in-job and reported by the leaders, slow pipeline 1's plan; recovery restores it."""
    truth = GroundTruth([0.01, 0.012])
    profile = write_truth_profile(truth, 2, tmp_path / "truth.csv")
    args = {"profile_path": str(profile), "p2p_power": truth.p2p_power_w, "straggler_rounds": 2}
    with running_server(_perseus(tmp_path, **args)) as url:
        job = SimulatedJob(url, truth, pp=2, dp=2, num_microbatches=M, leaders_per_stage=1)

        async def main() -> None:
            async with httpx.AsyncClient(timeout=60) as client:
                await job.run(client, 2)
                truth.slowdown = {0: 1.25}
                await job.run(client, 3)
                truth.slowdown = {}
                await job.run(client, 3)

        asyncio.run(main())
    h = [job.every_rank(s) for s in job.history]
    dp0, dp1 = 0, 2  # rank = dp·pp + pp
    chosen = h[1]
    assert h[3] == chosen
    assert h[4][dp1] != chosen[dp1] and h[4][dp0] == chosen[dp0]
    assert sum(stage_freqs(h[4], dp1)) < sum(stage_freqs(chosen, dp1))
    # The leader of stage 0 handed pipeline 1's list out as its replica's own.
    assert set(job.history[4][0].replica_frequencies) == {1}
    assert h[7] == chosen


def test_a_3d_job_with_leaders_profiles_deploys_and_measures_its_blocking_power(tmp_path):
    """pp 2 × dp 2 × tp 2 online: every rank of a stage runs the stage plan, and the blocking
    power the leaders measured in-job is that of a stage's two tensor GPUs."""
    truth = GroundTruth([0.010, 0.014])
    with running_server(_perseus(tmp_path, freq_step=4, warmup_rounds=0)) as url:
        job = SimulatedJob(url, truth, pp=2, dp=2, tp=2, num_microbatches=M, leaders_per_stage=1)
        job.run_sync(15)
    assert job.statuses[-2].phase == "deployed"
    deployed = job.every_rank(job.history[-1])
    for info in job.all_infos:
        first = next(i for i in job.all_infos if i.pp_rank == info.pp_rank)
        assert deployed[info.rank].frequencies == deployed[first.rank].frequencies
    assert any(len(set(stage_freqs(deployed, r))) > 1 for r in deployed)
    plan = load_plan(tmp_path / job.job_id / "deployed_plan.json")
    assert plan.p2p_power == pytest.approx(2 * truth.p2p_power_w, rel=2e-3)


def test_a_restarted_coordinator_restores_a_leader_job_and_its_leaders(tmp_path):
    """The dump holds the job's two leaders (not its 8 ranks); a restart resumes the job, and
    the leaders carry on with the same schedules."""
    settings = PerseusSettings(
        scheduler="AllMaxFrequency",
        scheduler_args={"num_microbatches": M},
        dump_dir=str(tmp_path / "dump"),
        dump_data=True,
    )
    truth = GroundTruth([0.01, 0.012])
    with running_server(settings) as url:
        job = SimulatedJob(url, truth, pp=2, dp=2, tp=2, num_microbatches=M, leaders_per_stage=1)
        job.run_sync(2)
    ranks = (tmp_path / "dump" / job.job_id / "ranks.json").read_text()
    assert [r["rank"] for r in json.loads(ranks)] == [0, 2]
    with running_server(settings) as url:
        job.base_url = url
        job.run_sync(1)
        listed = httpx.get(f"{url}/jobs").json()
    assert job.history[-1] == job.history[0]
    assert listed[0]["talking_ranks"] == 2 and listed[0]["ranks_registered"] == 2
