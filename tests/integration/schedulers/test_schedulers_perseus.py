"""The Perseus scheduler online, with the real frontier solver, against a pipeline of
emulated GPUs (`server_fixtures`): every measured figure here is the emulator's."""

from __future__ import annotations

import asyncio
import json
import statistics

import httpx
import pytest
from server_fixtures import (
    F_MAX,
    GroundTruth,
    SimulatedJob,
    all_max_round,
    pipeline_energy_and_time,
    running_server,
    stage_freqs,
    write_truth_profile,
)

from perseus.domain.schedule import make_schedule
from perseus.io.plan_file import load_plan
from perseus.io.profile_csv import read_profile_rows
from perseus.planning import Frontier
from perseus.settings import PerseusSettings

M = 4
IMBALANCED = [0.010, 0.016, 0.010, 0.012]
P2P_REL = 2e-3
"""How close the blocking power the job measured comes to the GPU's: within the energy
counter's 1 mJ resolution over the tens of milliseconds a rank waits per iteration."""
NO_BASELINE = {"baseline_rounds": 0}
"""For tests about something other than the all-max baseline and the guard: a given
profile and blocking power deploy at once."""


def settings(tmp_path, **args) -> PerseusSettings:
    return PerseusSettings(
        scheduler="Perseus",
        scheduler_args={"num_microbatches": M, **args},
        dump_dir=str(tmp_path),
        dump_data=True,
    )


def test_profiles_solves_and_deploys_a_plan_that_saves_energy_without_slowdown(tmp_path):
    truth = GroundTruth(IMBALANCED)
    with running_server(settings(tmp_path, freq_step=4)) as url:
        job = SimulatedJob(url, truth, pp=4, num_microbatches=M)
        history = job.run_sync(25)
    dp_of = {i.rank: i.dp_rank for i in job.infos}
    # A warm-up and the 4 all-max rounds of the baseline first.
    all_max = [k for k, h in enumerate(history) if set(stage_freqs(h, 0)) == {F_MAX}]
    assert all_max[:5] == [0, 1, 2, 3, 4]
    figures = [pipeline_energy_and_time(job.results[k], dp_of) for k in all_max[1:5]]
    all_max_energy = statistics.median(e for e, _ in figures)
    all_max_time = statistics.median(t for _, t in figures)
    phases = [s.phase if s else None for s in job.statuses]
    deployed = history[-1]
    assert phases[-5:] == ["deployed"] * 5 and all(h == deployed for h in history[-5:])
    energy, time_s = pipeline_energy_and_time(job.results[-1], dp_of)
    assert time_s <= all_max_time * (1 + 1e-9)
    assert energy < 0.9 * all_max_energy, (energy, all_max_energy)
    # The guard measured the same and kept the plan.
    notes = [n.text for s in job.statuses if s for n in s.notes]
    assert any(n.startswith("guard: keeps the plan") for n in notes), notes
    # Not one frequency per stage: per-instruction planning on the non-critical stages.
    assert any(len(set(stage_freqs(deployed, r))) > 1 for r in range(4))
    job_dir = tmp_path / job.job_id
    plan = load_plan(job_dir / "deployed_plan.json")
    assert plan.p2p_power == pytest.approx(truth.p2p_power_w, rel=P2P_REL)  # measured
    assert [[f for _, f in s] for s in plan.frequencies] == [
        stage_freqs(deployed, r) for r in range(4)
    ]
    assert (job_dir / "instruction_profile.csv").is_file()
    assert not plan.emulated and "emulated" not in (job_dir / "deployed_plan.json").read_text()
    assert not any(r.emulated for r in read_profile_rows(job_dir / "instruction_profile.csv"))
    frontier = Frontier.read(job_dir / "frontier")
    assert frontier.points[0].iteration_time_s == pytest.approx(all_max_time, rel=1e-9)


@pytest.mark.parametrize("choice", [{"max_slowdown": 0.1}, {"deadline": "from_max"}])
def test_max_slowdown_and_deadline_choose_slower_cheaper_plans(tmp_path, choice):
    truth = GroundTruth(IMBALANCED)
    profile = write_truth_profile(truth, 4, tmp_path / "truth.csv")
    base = {"profile_path": str(profile), "p2p_power": truth.p2p_power_w, **NO_BASELINE}
    with running_server(settings(tmp_path, **base)) as url:
        fast = SimulatedJob(url, truth, pp=4, num_microbatches=M)
        fast.run_sync(1)
    dp_of = {i.rank: i.dp_rank for i in fast.infos}
    e0, t0 = pipeline_energy_and_time(fast.results[0], dp_of)
    if "deadline" in choice:
        choice = {"deadline": t0 * 1.05}
    with running_server(settings(tmp_path, **base, **choice)) as url:
        slow = SimulatedJob(url, truth, pp=4, num_microbatches=M)
        slow.run_sync(1)
    e1, t1 = pipeline_energy_and_time(slow.results[0], dp_of)
    limit = t0 * 1.1 if "max_slowdown" in choice else choice["deadline"]
    assert t0 < t1 <= limit * (1 + 1e-9)
    assert e1 < e0


def _announce(url: str, job_id: str, dp_rank: int, slowdown: float) -> httpx.Response:
    return httpx.post(f"{url}/straggler/{job_id}", json={"dp_rank": dp_rank, "slowdown": slowdown})


def test_straggler_announcement_slows_the_other_pipelines_then_recovery(tmp_path):
    truth = GroundTruth([0.01, 0.012])
    profile = write_truth_profile(truth, 2, tmp_path / "truth.csv")
    args = {"profile_path": str(profile), "p2p_power": truth.p2p_power_w, **NO_BASELINE}
    with running_server(settings(tmp_path, **args)) as url:
        job = SimulatedJob(url, truth, pp=2, dp=2, num_microbatches=M)
        job.run_sync(1)
        chosen = job.history[-1]
        pipelines = {d: [i.rank for i in job.infos if i.dp_rank == d] for d in (0, 1)}
        assert [chosen[r].frequencies for r in pipelines[0]] == [
            chosen[r].frequencies for r in pipelines[1]
        ]
        r = _announce(url, job.job_id, 1, 1.3)
        assert r.status_code == 200, r.text
        truth.slowdown = {1: 1.3}  # it does straggle
        job.run_sync(1)
        during = job.history[-1]
        for r0, r1 in zip(pipelines[0], pipelines[1], strict=True):
            assert during[r1].frequencies == chosen[r1].frequencies  # the straggler keeps its plan
            assert sum(stage_freqs(during, r0)) < sum(stage_freqs(chosen, r0))  # others slow down

        # The others' plan still meets the straggler's time, measured, and no more than that
        # is lost.
        def makespan(round_: int, dp: int) -> float:
            return max(r.iter_time[0] for r in job.results[round_] if r.rank in pipelines[dp])

        assert makespan(-1, 1) == pytest.approx(1.3 * makespan(0, 1), rel=1e-9)
        assert makespan(0, 0) < makespan(-1, 0) <= makespan(-1, 1) * (1 + 1e-9)
        assert _announce(url, job.job_id, 1, 1.0).status_code == 200
        truth.slowdown = {}
        job.run_sync(1)
        assert job.history[-1] == chosen
        bad = _announce(url, job.job_id, 2, 1.2)
        assert bad.status_code == 400 and "dp_rank 2" in bad.json()["detail"]


def test_a_straggler_detected_from_results_changes_the_other_pipelines_plan(tmp_path):
    truth = GroundTruth([0.01, 0.012])
    profile = write_truth_profile(truth, 2, tmp_path / "truth.csv")
    args = {"profile_path": str(profile), "p2p_power": truth.p2p_power_w, "straggler_rounds": 2}
    args |= NO_BASELINE
    with running_server(settings(tmp_path, **args)) as url:
        job = SimulatedJob(url, truth, pp=2, dp=2, num_microbatches=M)

        async def main() -> None:
            async with httpx.AsyncClient(timeout=60) as client:
                await job.run(client, 2)
                truth.slowdown = {0: 1.25}
                await job.run(client, 3)
                truth.slowdown = {}
                await job.run(client, 3)

        asyncio.run(main())
    h = job.history
    dp1_rank = next(i.rank for i in job.infos if i.dp_rank == 1)
    dp0_rank = next(i.rank for i in job.infos if i.dp_rank == 0)
    chosen = h[1]
    # Rounds 2, 3 ran slow (results observed before rounds 3, 4): the other pipeline changes
    # from round 4 on, never before two slow rounds were seen.
    assert h[3] == chosen
    assert h[4][dp1_rank] != chosen[dp1_rank]
    assert h[4][dp0_rank] == chosen[dp0_rank]
    assert sum(stage_freqs(h[4], dp1_rank)) < sum(stage_freqs(chosen, dp1_rank))
    # Recovery: rounds 5 and 6 run normally again → back to the chosen plan at round 7.
    assert h[7] == chosen


def test_perseus_rejects_a_profile_that_does_not_fit(tmp_path):
    three = write_truth_profile(GroundTruth([0.01] * 3), 3, tmp_path / "three.csv")
    with running_server(settings(tmp_path, profile_path=str(three))) as url:
        job = SimulatedJob(url, GroundTruth([0.01] * 2), pp=2, num_microbatches=M)
        with pytest.raises(httpx.HTTPStatusError) as info:
            job.run_sync(1)
    assert info.value.response.status_code == 400
    assert "3 stage(s)" in info.value.response.json()["detail"]


def test_3d_job_every_rank_of_a_stage_runs_the_stage_plan(tmp_path):
    truth = GroundTruth([0.010, 0.014])
    args = {"freq_step": 4, "warmup_rounds": 0, **NO_BASELINE}
    with running_server(settings(tmp_path, **args)) as url:
        job = SimulatedJob(url, truth, pp=2, dp=2, tp=2, num_microbatches=M)
        history = job.run_sync(15)  # deployed from round 13
    assert job.statuses[-2].phase == "deployed"
    deployed = history[-1]
    for info in job.infos:
        first = next(i for i in job.infos if i.pp_rank == info.pp_rank)
        assert deployed[info.rank].frequencies == deployed[first.rank].frequencies
    assert any(len(set(stage_freqs(deployed, r))) > 1 for r in deployed)
    plan = load_plan(tmp_path / job.job_id / "deployed_plan.json")
    # The blocking power of a stage is that of its tp GPUs together.
    assert plan.p2p_power == pytest.approx(2 * truth.p2p_power_w, rel=P2P_REL)


def test_numbers_from_emulated_gpus_are_marked_in_the_profile_and_the_deployed_plan(tmp_path):
    """A rank that registers an emulated GPU: the sweep's rows of its stage say so, and so
    does the deployed plan; a job of real GPUs (the test above) writes neither mark."""
    truth = GroundTruth(IMBALANCED)
    args = {"freq_step": 4, "warmup_rounds": 0, **NO_BASELINE}
    with running_server(settings(tmp_path, **args)) as url:
        job = SimulatedJob(url, truth, pp=4, num_microbatches=M)
        job.infos = [i.model_copy(update={"emulated": i.pp_rank == 1}) for i in job.infos]
        job.run_sync(15)  # deployed from round 13
    assert job.statuses[-1].phase == "deployed"
    job_dir = tmp_path / job.job_id
    rows = read_profile_rows(job_dir / "instruction_profile.csv")
    assert {(r.stage, r.emulated) for r in rows} == {(0, False), (1, True), (2, False), (3, False)}
    assert load_plan(job_dir / "deployed_plan.json").emulated is True
    assert json.loads((job_dir / "deployed_plan.json").read_text())["emulated"] is True
    assert Frontier.read(job_dir / "frontier").emulated


def test_a_plan_deployed_on_emulated_gpus_is_marked_even_from_a_real_profile(tmp_path):
    truth = GroundTruth(IMBALANCED)
    profile = write_truth_profile(truth, 4, tmp_path / "truth.csv")
    args = {"profile_path": str(profile), "p2p_power": truth.p2p_power_w, **NO_BASELINE}
    with running_server(settings(tmp_path, **args)) as url:
        job = SimulatedJob(url, truth, pp=4, num_microbatches=M)
        job.infos = [i.model_copy(update={"emulated": True}) for i in job.infos]
        job.run_sync(1)
    assert load_plan(tmp_path / job.job_id / "deployed_plan.json").emulated is True


def test_max_slowdown_zero_deploys_the_cheapest_plan_within_the_all_max_time(tmp_path):
    """On A40s, whose top clocks run power-capped (every clock from the cap up runs as
    fast, and as dear, as the cap), the default max_slowdown of 0 deploys the cheapest plan
    no slower than all-max, whatever clocks it uses: measured, it is no slower and cheaper
    than all-max."""
    truth = GroundTruth(IMBALANCED, gpu_type="A40")
    profile = write_truth_profile(truth, 4, tmp_path / "truth.csv")
    args = {"profile_path": str(profile), "p2p_power": truth.p2p_power_w, **NO_BASELINE}
    with running_server(settings(tmp_path, **args)) as url:
        job = SimulatedJob(url, truth, pp=4, num_microbatches=M)
        job.run_sync(1)
    dp_of = {i.rank: i.dp_rank for i in job.infos}
    measured_max = all_max_round(truth, make_schedule("1f1b", 4, M))
    all_max_energy, all_max_time = pipeline_energy_and_time(measured_max, dp_of)
    energy, time_s = pipeline_energy_and_time(job.results[0], dp_of)
    frontier = Frontier.read(tmp_path / job.job_id / "frontier")
    assert frontier.all_max is not None
    assert frontier.all_max.iteration_time_s == pytest.approx(all_max_time, rel=1e-9)
    # The frontier's fast end is all-max's time (capped clocks are no faster), not below.
    assert frontier.points[0].iteration_time_s == pytest.approx(all_max_time, rel=1e-9)
    chosen = frontier.choose(max_slowdown=0.0)
    assert chosen.energy_j == min(
        p.energy_j for p in frontier.points if p.iteration_time_s <= all_max_time * (1 + 1e-9)
    )
    deployed = job.history[-1]
    assert [stage_freqs(deployed, r) for r in range(4)] == chosen.frequencies
    assert time_s <= all_max_time * (1 + 1e-9)
    assert energy < all_max_energy


def test_a_switch_latency_makes_the_deployed_plan_count_its_clock_changes(tmp_path):
    from perseus.domain.plan import clock_changes
    from perseus.io.profile_csv import load_profile
    from perseus.planning import evaluate_plan

    truth = GroundTruth(IMBALANCED)
    profile = write_truth_profile(truth, 4, tmp_path / "truth.csv")
    args = {
        "profile_path": str(profile),
        "p2p_power": truth.p2p_power_w,
        "max_slowdown": 0.1,
        "switch_latency_ms": 5.0,
        **NO_BASELINE,
    }
    with running_server(settings(tmp_path, **args)) as url:
        job = SimulatedJob(url, truth, pp=4, num_microbatches=M)
        job.run_sync(1)
    job_dir = tmp_path / job.job_id
    plan = load_plan(job_dir / "deployed_plan.json")
    assert plan.switch_latency == 0.005
    assert plan.clock_changes == clock_changes(plan.stage_frequencies()) > 0
    # Its numbers are the switching model's: re-scored free, they differ.
    prof = load_profile(profile)
    assert evaluate_plan(prof, plan).iteration_time_s == pytest.approx(plan.iteration_time)
    free = evaluate_plan(prof, plan, switch_latency_s=0.0)
    assert free.iteration_time_s != pytest.approx(plan.iteration_time, rel=1e-9)
    assert Frontier.read(job_dir / "frontier").switch_latency_s == 0.005
