"""Jobs that describe their pipeline (issue 29): the online schedulers profile one stage per
pipeline (virtual) stage with every kind the schedule runs, plan from that profile, and one
coordinator serves pipelines of different shapes at once. Real coordinator on loopback,
ranks on emulated GPUs (`server_fixtures`)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from server_fixtures import (
    ENERGY_ABS_J,
    F_MAX,
    FREQS,
    GroundTruth,
    SimulatedJob,
    pipeline_energy_and_time,
    running_server,
    stage_freqs,
)

from perseus.domain.schedule import PipelineSchedule, make_schedule
from perseus.io.plan_file import load_plan
from perseus.io.profile_csv import load_profile, read_profile_rows
from perseus.protocol import InstructionProfilingResult
from perseus.settings import PerseusSettings

MIN_FREQ = 1170
LEVELS = [f for f in FREQS[::4] if f >= MIN_FREQ]  # freq_step 4: 1410, 1350, … 1170 MHz
NO_BASELINE = {"baseline_rounds": 0}
"""Perseus deploys once its profile is complete (these tests are not about the all-max
baseline and the guard)."""


def _v_shape(M: int) -> PipelineSchedule:
    """Two ranks holding a V (rank 0: stages 0 and 3, rank 1: stages 1 and 2), as ZBV
    does, with split backwards: each rank runs its stages' forwards, then I and W."""
    orders = [
        [(s, k, j) for s, k in ((0, "forward"), (3, "forward")) for j in range(M)]
        + [(s, k, j) for s in (3, 0) for k in ("backward_input", "backward_weight") for j in range(M)],
        [(s, k, j) for s, k in ((1, "forward"), (2, "forward")) for j in range(M)]
        + [(s, k, j) for s in (2, 1) for k in ("backward_input", "backward_weight") for j in range(M)],
    ]
    return PipelineSchedule.from_orders("v-shape", orders, M)


PIPELINES = {
    "zb": lambda: make_schedule("zb", 3, 4),
    "interleaved": lambda: make_schedule("interleaved", 2, 4, num_chunks=2),
    "v-shape": lambda: _v_shape(3),
}
TRUTH = [0.010, 0.016, 0.011, 0.013]  # per virtual stage: uneven, so there is slack


def settings(tmp_path, scheduler: str, **args) -> PerseusSettings:
    """No num_microbatches: the coordinator has no default pipeline, jobs must describe theirs."""
    return PerseusSettings(
        scheduler=scheduler, scheduler_args=args, dump_dir=str(tmp_path), dump_data=True
    )


def _units(schedule: PipelineSchedule) -> set[tuple[int, str]]:
    return {(i.stage, i.kind) for order in schedule.orders for i in order}


@pytest.mark.parametrize("name", list(PIPELINES))
def test_profiler_writes_every_virtual_stage_and_kind_of_the_schedule(tmp_path, name):
    schedule = PIPELINES[name]()
    truth = GroundTruth(TRUTH[: schedule.num_virtual_stages])
    args = {"warmup_rounds": 1, "freq_step": 4, "early_stop_after": 99, "sweep": "full"}
    args["min_frequency"] = MIN_FREQ
    with running_server(settings(tmp_path, "InstructionProfiler", **args)) as url:
        job = SimulatedJob(url, truth, schedule=schedule)
        history = job.run_sync(len(LEVELS) + 2)
    # Every rank runs its own order; while sweeping, one level for every instruction.
    for h in history:
        for info in job.infos:
            assert [k for k, _ in h[info.rank].frequencies] == schedule.kinds()[info.pp_rank]
    assert [set(stage_freqs(h, 0)) for h in history[1 : 1 + len(LEVELS)]] == [
        {f} for f in LEVELS
    ]
    csv = tmp_path / job.job_id / "instruction_profile.csv"
    rows = read_profile_rows(csv)
    assert {(r.stage, r.instruction) for r in rows} == _units(schedule)
    for r in rows:  # pp_rank says which rank holds the stage; stage is the virtual stage
        assert r.pp_rank == schedule.stage_ranks[r.stage] == r.rank
        assert r.frequency in LEVELS
        assert r.time == pytest.approx(truth.time_s(r.stage, r.instruction, r.frequency), rel=1e-9)
        assert r.energy == pytest.approx(
            truth.energy_j(r.stage, r.instruction, r.frequency), abs=ENERGY_ABS_J
        )
    assert len(rows) == len(_units(schedule)) * len(LEVELS)
    # The file round-trips through the wire model (stage kept) and the solver's profile.
    result = InstructionProfilingResult.from_csv(csv)
    assert sorted(e.pipeline_stage for e in result.root) == list(range(schedule.num_virtual_stages))
    assert sorted(result.rows()) == sorted(rows)
    profile = load_profile(csv)
    assert profile.num_stages == schedule.num_virtual_stages
    schedule.check_profile(profile)


@pytest.mark.parametrize("name", ["zb", "interleaved"])
def test_perseus_deploys_a_plan_for_a_described_pipeline(tmp_path, name):
    schedule = PIPELINES[name]()
    truth = GroundTruth(TRUTH[: schedule.num_virtual_stages])
    args = {"warmup_rounds": 1, "freq_step": 4, **NO_BASELINE}
    with running_server(settings(tmp_path, "Perseus", **args)) as url:
        job = SimulatedJob(url, truth, schedule=schedule)
        history = job.run_sync(16)  # deployed from round 14
    deployed = history[-1]
    assert [s.phase for s in job.statuses[-2:]] == ["deployed"] * 2
    assert deployed == history[-2], "the plan stays deployed"
    dp_of = {i.rank: i.dp_rank for i in job.infos}
    all_max_energy, all_max_time = pipeline_energy_and_time(job.results[0], dp_of)
    energy, time_s = pipeline_energy_and_time(job.results[-1], dp_of)
    assert time_s <= all_max_time * (1 + 1e-9)
    assert energy < 0.99 * all_max_energy, (energy, all_max_energy)
    plan = load_plan(tmp_path / job.job_id / "deployed_plan.json")
    assert plan.pipeline_schedule().actions() == schedule.actions()
    assert [[f for _, f in s] for s in plan.frequencies] == [
        stage_freqs(deployed, r) for r in range(schedule.num_stages)
    ]
    # The plan's prediction is what the simulated pipeline ran.
    assert plan.iteration_time == pytest.approx(time_s, rel=1e-9)
    profile = load_profile(tmp_path / job.job_id / "instruction_profile.csv")
    assert profile.num_stages == schedule.num_virtual_stages


def test_two_jobs_of_different_microbatch_counts_share_one_coordinator(tmp_path):
    truth = GroundTruth([0.010, 0.014])
    args = {"warmup_rounds": 1, "freq_step": 4, "min_frequency": MIN_FREQ, **NO_BASELINE}
    with running_server(settings(tmp_path, "Perseus", **args)) as url:
        jobs = [
            SimulatedJob(url, truth, schedule=make_schedule("1f1b", 2, 3)),
            SimulatedJob(url, truth, schedule=make_schedule("zb", 2, 6)),
        ]

        async def main():
            async with httpx.AsyncClient(timeout=60.0) as client:
                for job in jobs:
                    await job.register(client)
                await asyncio.gather(*(job.run(client, len(LEVELS) + 3) for job in jobs))

        asyncio.run(main())
    for job in jobs:
        assert job.schedule is not None
        for h in job.history:  # each job got schedules of its own pipeline, every round
            for info in job.infos:
                assert len(h[info.rank].frequencies) == len(job.schedule.orders[info.pp_rank])
        plan = load_plan(tmp_path / job.job_id / "deployed_plan.json")
        assert plan.num_microbatches == job.schedule.num_microbatches
        assert plan.pipeline_schedule().actions() == job.schedule.actions()
        assert job.history[-1] == job.history[-2]


def test_a_job_without_a_pipeline_needs_a_coordinator_default(tmp_path):
    truth = GroundTruth([0.010, 0.014])
    with running_server(settings(tmp_path, "InstructionProfiler")) as url:
        old = SimulatedJob(url, truth, pp=2, num_microbatches=3)
        r = httpx.post(f"{url}/register_job", json=old.info.model_dump())
    assert r.status_code == 422
    assert "did not describe its pipeline" in r.json()["detail"]
    assert "num_microbatches" in r.json()["detail"]
    # With a default, old clients keep working (and a describing job beside them).
    default = settings(
        tmp_path, "InstructionProfiler", num_microbatches=3, freq_step=7, min_frequency=1300
    )
    with running_server(default) as url:
        old = SimulatedJob(url, truth, pp=2, num_microbatches=3)
        new = SimulatedJob(url, truth, schedule=make_schedule("zb", 2, 5))
        old.run_sync(4)
        new.run_sync(4)
    for job in (old, new):
        rows = read_profile_rows(tmp_path / job.job_id / "instruction_profile.csv")
        kinds = {r.instruction for r in rows}
        assert kinds == (
            {"forward", "backward"}
            if job is old
            else {"forward", "backward_input", "backward_weight"}
        )


@pytest.mark.parametrize("scheduler", ["EnvPipe", "ZeusGlobal", "ZeusPerStage"])
@pytest.mark.parametrize("name", ["zb", "interleaved"])
def test_the_baselines_plan_a_described_pipeline(tmp_path, scheduler, name):
    schedule = PIPELINES[name]()
    truth = GroundTruth(TRUTH[: schedule.num_virtual_stages])
    args = {"warmup_rounds": 1, "freq_step": 3, "min_frequency": MIN_FREQ}
    with running_server(settings(tmp_path, scheduler, **args)) as url:
        job = SimulatedJob(url, truth, schedule=schedule)
        history = job.run_sync(9)  # deployed from round 7
    deployed = history[-1]
    assert deployed == history[-2], "the plan stays deployed"
    plan = load_plan(tmp_path / job.job_id / "deployed_plan.json")
    assert plan.pipeline_schedule().actions() == schedule.actions()
    dp_of = {i.rank: i.dp_rank for i in job.infos}
    all_max_energy, all_max_time = pipeline_energy_and_time(job.results[0], dp_of)
    energy, time_s = pipeline_energy_and_time(job.results[-1], dp_of)
    assert plan.iteration_time == pytest.approx(time_s, rel=1e-9)
    if scheduler == "EnvPipe":  # bubbles only: never slower, and some energy saved
        assert time_s <= all_max_time * (1 + 1e-9)
        assert energy < all_max_energy
        busy = [sum(truth.time_s(i.stage, i.kind, F_MAX) for i in o) for o in schedule.orders]
        critical = max(range(schedule.num_stages), key=lambda r: (busy[r], r))
        assert set(stage_freqs(deployed, critical)) == {F_MAX}  # all its stages stay max
    else:  # one frequency per job, or per pipeline rank (all the stages it holds)
        per_rank = [set(stage_freqs(deployed, r)) for r in range(schedule.num_stages)]
        assert all(len(f) == 1 for f in per_rank)
        if scheduler == "ZeusGlobal":
            assert len(set.union(*per_rank)) == 1
