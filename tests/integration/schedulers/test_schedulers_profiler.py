"""InstructionProfiler through the real coordinator, fed by a pipeline of emulated GPUs."""

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
    running_server,
    stage_freqs,
)

from perseus.io.profile_csv import load_profile
from perseus.protocol import InstructionProfilingResult, ProfilingResult
from perseus.settings import PerseusSettings

M = 3


def profiler_settings(tmp_path, **args) -> PerseusSettings:
    return PerseusSettings(
        scheduler="InstructionProfiler",
        scheduler_args={"num_microbatches": M, **args},
        dump_dir=str(tmp_path),
        dump_data=False,
    )


def test_sweep_warms_up_strides_and_writes_the_true_profile(tmp_path):
    truth = GroundTruth([0.010, 0.014, 0.012])
    args = {"warmup_rounds": 2, "freq_step": 4, "min_frequency": 1170, "sweep": "full"}
    with running_server(profiler_settings(tmp_path, **args)) as url:
        job = SimulatedJob(url, truth, pp=3, num_microbatches=M)
        history = job.run_sync(9)
    levels = [1410, 1350, 1290, 1230, 1170]
    per_round = [set(stage_freqs(h, r)) for h in history for r in (0,)]
    assert per_round[:2] == [{F_MAX}, {F_MAX}]  # warm-up
    assert [next(iter(s)) for s in per_round[2:7]] == levels  # one level per round, high → low
    assert per_round[7:] == [{F_MAX}, {F_MAX}]  # done: back to max
    for h in history:  # every stage runs one frequency per round here
        assert len({f for r in h for f in stage_freqs(h, r)}) == 1
    csv = tmp_path / job.job_id / "instruction_profile.csv"
    assert csv.is_file(), "the profile is written even with dump_data off"
    profile = load_profile(csv)
    assert profile.num_stages == 3
    for stage in range(3):
        for kind in ("forward", "backward"):
            opts = profile.options(stage, kind)
            assert opts.freq_mhz.tolist() == levels
            for f, t, e in zip(opts.freq_mhz, opts.time_s, opts.energy_j, strict=True):
                assert t == pytest.approx(truth.time_s(stage, kind, int(f)), rel=1e-12)
                assert e == pytest.approx(truth.energy_j(stage, kind, int(f)), abs=ENERGY_ABS_J)


def test_early_stop_per_stage_and_instruction(tmp_path):
    # A compute-bound stage's energy turns up at a higher frequency than a memory-bound one's.
    truth = GroundTruth([0.01, 0.01], memory_fraction=[0.0, 0.9])
    args = {"warmup_rounds": 0, "early_stop_after": 2, "sweep": "full", "freq_step": 2}
    levels = FREQS[::2]
    with running_server(profiler_settings(tmp_path, **args)) as url:
        job = SimulatedJob(url, truth, pp=2, num_microbatches=M)
        history = job.run_sync(len(levels) + 1)
    profile = load_profile(tmp_path / job.job_id / "instruction_profile.csv")
    stops = {}
    for stage in (0, 1):
        energies = [truth.energy_j(stage, "forward", f) for f in levels]
        rises = 0
        for k in range(1, len(levels)):
            rises = rises + 1 if energies[k] > energies[k - 1] else 0
            if rises == 2:
                break
        expected = levels[: k + 1]
        stops[stage] = len(expected)
        for kind in ("forward", "backward"):
            assert profile.options(stage, kind).freq_mhz.tolist() == expected
    assert stops[0] < stops[1] < len(levels), stops
    # Stage 0 stopped early: from then on it runs at max while stage 1 keeps sweeping.
    k0 = stops[0]
    assert set(stage_freqs(history[k0], 0)) == {F_MAX}
    assert set(stage_freqs(history[k0], 1)) == {levels[k0]}


def test_3d_parallelism_time_is_max_energy_sums_tp_of_first_pipeline(tmp_path):
    truth = GroundTruth([0.01, 0.02], slowdown={1: 1.25})
    args = {"warmup_rounds": 0, "freq_step": 7, "min_frequency": FREQS[7]}  # two levels
    with running_server(profiler_settings(tmp_path, **args)) as url:
        job = SimulatedJob(url, truth, pp=2, dp=2, tp=2, num_microbatches=M)
        history = job.run_sync(3)
    for h in history:  # every rank of a stage gets the stage's list
        for info in job.infos:
            first = next(i for i in job.infos if i.pp_rank == info.pp_rank)
            assert h[info.rank].frequencies == h[first.rank].frequencies
    result = InstructionProfilingResult.from_csv(tmp_path / job.job_id / "instruction_profile.csv")
    assert [(r.rank, r.dp_rank, r.pp_rank, r.tp_rank) for r in result.root] == [
        (0, 0, 0, 0),
        (2, 0, 1, 0),
    ]
    for entry in result.root:
        for f in (F_MAX, FREQS[7]):
            stage = entry.pp_rank
            assert entry.forward_time[f] == pytest.approx(
                1.25 * truth.time_s(stage, "forward", f)
            )  # the straggling pipeline sets the pace
            assert entry.backward_energy[f] == pytest.approx(
                2 * truth.energy_j(stage, "backward", f), abs=2 * ENERGY_ABS_J
            )  # two tp GPUs of the first pipeline


def test_missing_results_repeat_the_step_then_fail_naming_the_problem(tmp_path):
    with running_server(profiler_settings(tmp_path, warmup_rounds=0, sweep="full")) as url:
        job = SimulatedJob(url, GroundTruth([0.01, 0.01]), pp=2, num_microbatches=M)

        async def main():
            async with httpx.AsyncClient(timeout=30) as client:
                await job.register(client)
                first = await job.ask_all(client)
                # Only rank 0 reports: the step is repeated.
                res = job.results_for(first)
                await client.post(f"{url}/result/{job.job_id}", json=res[0].model_dump())
                second = await job.ask_all(client)
                assert second == first
                await job.report(client, second)
                third = await job.ask_all(client)
                assert stage_freqs(third, 0)[0] == FREQS[1]
                for _ in range(2):  # nobody reports
                    await job.ask_all(client)
                return await asyncio.gather(
                    *(
                        client.get(f"{url}/schedule/{job.job_id}", params={"rank": r})
                        for r in (0, 1)
                    )
                )

        failed = asyncio.run(main())
    assert [r.status_code for r in failed] == [400, 400]
    assert "without a result from every rank" in failed[0].json()["detail"]


def test_results_without_breakdowns_are_a_422_naming_the_rank_and_the_job_goes_on(tmp_path):
    with running_server(profiler_settings(tmp_path, warmup_rounds=0)) as url:
        job = SimulatedJob(url, GroundTruth([0.01]), pp=1, num_microbatches=M)

        async def main():
            async with httpx.AsyncClient(timeout=30) as client:
                await job.register(client)
                await job.ask_all(client)
                bare = ProfilingResult(rank=0, iter_time=[1.0], iter_energy=[10.0])
                refused = await client.post(f"{url}/result/{job.job_id}", json=bare.model_dump())
                nxt = await client.get(f"{url}/schedule/{job.job_id}", params={"rank": 0})
                return refused, nxt

        refused, nxt = asyncio.run(main())
    # Refused where it arrives (the job's state untouched), not when the scheduler meets it.
    assert refused.status_code == 422
    detail = refused.json()["detail"]
    assert "Rank 0" in detail and str(job.job_id) in detail
    assert "scheduler InstructionProfiler needs them" in detail
    assert nxt.status_code == 200
