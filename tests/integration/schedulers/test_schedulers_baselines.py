"""The EnvPipe and Zeus baselines: real choices, checked against emulated GPUs' measurements
and the emulator's model numbers."""

from __future__ import annotations

import math

import pytest
from server_fixtures import (
    F_MAX,
    FREQS,
    GroundTruth,
    SimulatedJob,
    pipeline_energy_and_time,
    running_server,
    stage_freqs,
    write_truth_profile,
)

from perseus.domain.schedule import make_schedule
from perseus.io.profile_csv import load_profile
from perseus.planning import evaluate, max_frequencies, solve_frontier
from perseus.schedulers.envpipe import envpipe_frequencies
from perseus.settings import PerseusSettings

M = 4
MIN_FREQ = 600
LEVELS = [f for f in FREQS[::4] if f >= MIN_FREQ]  # freq_step 4: 1410, 1350, … 630 MHz
FINE_LEVELS = [f for f in FREQS[::2] if f >= MIN_FREQ]  # freq_step 2: 1410, 1380, … 630 MHz


def settings(name: str, tmp_path, **args) -> PerseusSettings:
    return PerseusSettings(
        scheduler=name,
        scheduler_args={"num_microbatches": M, **args},
        dump_dir=str(tmp_path),
    )


def test_envpipe_slows_bubbles_only_keeping_the_all_max_iteration_time(tmp_path):
    truth = GroundTruth([0.010, 0.013, 0.010, 0.016])  # stage 3 is the critical one
    profile = write_truth_profile(truth, 4, tmp_path / "truth.csv")
    args = {"profile_path": str(profile), "p2p_power": truth.p2p_power_w}
    with running_server(settings("AllMaxFrequency", tmp_path)) as url:
        base = SimulatedJob(url, truth, pp=4, num_microbatches=M)
        base.run_sync(1)
    with running_server(settings("EnvPipe", tmp_path, **args)) as url:
        job = SimulatedJob(url, truth, pp=4, num_microbatches=M)
        job.run_sync(2)
    dp_of = {i.rank: 0 for i in job.infos}
    e_max, t_max = pipeline_energy_and_time(base.results[0], dp_of)
    e_env, t_env = pipeline_energy_and_time(job.results[-1], dp_of)
    assert set(stage_freqs(job.history[-1], 3)) == {F_MAX}  # the critical stage stays max
    assert any(min(stage_freqs(job.history[-1], r)) < F_MAX for r in range(3))
    assert t_env == pytest.approx(t_max, rel=1e-9)
    assert e_env < e_max


def test_envpipe_never_beats_the_frontier_at_the_same_time(real_profile_path):
    profile = load_profile(real_profile_path)
    schedule = make_schedule("1f1b", profile.num_stages, 6)
    p2p = 70.38
    freqs = envpipe_frequencies(profile, schedule, p2p)
    env = evaluate(profile, schedule, freqs, p2p)
    fast = evaluate(profile, schedule, max_frequencies(profile, schedule), p2p)
    assert env.iteration_time_s <= fast.iteration_time_s * (1 + 1e-9)
    assert env.energy_j < fast.energy_j
    best = solve_frontier(profile, schedule, p2p_power_w=p2p).choose(
        deadline_s=env.iteration_time_s
    )
    assert best.energy_j <= env.energy_j * (1 + 1e-9)


def zeus_cost(energy: float, time_s: float, eta: float, max_power: float) -> float:
    return eta * energy + (1 - eta) * max_power * time_s


@pytest.mark.parametrize("eta", [0.0, 0.5, 1.0])
def test_zeus_global_picks_the_min_cost_frequency_for_all_gpus(tmp_path, eta):
    truth = GroundTruth([0.010, 0.014])
    args = {"eta_knob": eta, "warmup_rounds": 0, "freq_step": 4, "min_frequency": MIN_FREQ}
    with running_server(settings("ZeusGlobal", tmp_path, **args)) as url:
        job = SimulatedJob(url, truth, pp=2, dp=2, num_microbatches=M)
        job.run_sync(len(LEVELS) + 2)
    swept = {}
    max_power = None
    for schedules, results in zip(job.history, job.results, strict=True):
        freqs = {f for s in schedules.values() for _, f in s.frequencies}
        if len(freqs) != 1 or next(iter(freqs)) in swept:
            break
        energy = math.fsum(r.iter_energy[0] for r in results)
        time_s = max(r.iter_time[0] for r in results)
        max_power = max_power or energy / time_s  # the all-max round's average power
        swept[next(iter(freqs))] = zeus_cost(energy, time_s, eta, max_power)
    deployed = {f for s in job.history[-1].values() for _, f in s.frequencies}
    assert deployed == {min(swept, key=swept.get)}
    assert list(swept) == LEVELS[: len(swept)]  # high → low, until the cost turned up
    if eta == 0.0:
        assert deployed == {F_MAX}
    else:
        assert deployed != {F_MAX}


def test_zeus_per_stage_chooses_each_stages_own_min_cost_frequency(tmp_path):
    truth = GroundTruth([0.010, 0.010], memory_fraction=[0.0, 0.6])
    args = {"eta_knob": 0.8, "warmup_rounds": 1, "freq_step": 2, "min_frequency": MIN_FREQ}
    with running_server(settings("ZeusPerStage", tmp_path, **args)) as url:
        job = SimulatedJob(url, truth, pp=2, num_microbatches=M)
        job.run_sync(len(FINE_LEVELS) + 3)
    kinds = make_schedule("1f1b", 2, M).kinds()
    for stage in (0, 1):

        def cost(f: int, stage: int = stage) -> float:
            t = math.fsum(truth.time_s(stage, k, f) for k in kinds[stage])
            e = math.fsum(truth.energy_j(stage, k, f) for k in kinds[stage])
            return (t, e)

        t0, e0 = cost(F_MAX)
        expected = min(FINE_LEVELS, key=lambda f: zeus_cost(cost(f)[1], cost(f)[0], 0.8, e0 / t0))
        assert set(stage_freqs(job.history[-1], stage)) == {expected}
    assert stage_freqs(job.history[-1], 0)[0] != stage_freqs(job.history[-1], 1)[0]
