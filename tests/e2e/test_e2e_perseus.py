"""End to end: the same 4-rank torchrun job under AllMaxFrequency, then under Perseus.

Real coordinator processes on loopback, real torchrun with gloo, emulated GPUs (nominal
instruction times; see `tests/e2e_fixtures.py`). The layer split 2,4,3,1 is imbalanced:
stage 1 sets the pace, the others have slack Perseus turns into energy savings.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from e2e_fixtures import Coordinator, DemoJob, executed, require_torch, run_job, steps_of

from perseus.domain.schedule import make_schedule
from perseus.io.plan_file import load_plan
from perseus.io.profile_csv import load_profile
from perseus.planning import (
    calibrate_hop_latency,
    evaluate,
    evaluate_plan,
    hop_times,
    max_frequencies,
    pipeline_problem,
)

require_torch()

LAYERS = "2,4,3,1"
M = 4
MEASURED = 10  # steady-state steps compared
# Perseus profiles for about 45 steps: rounds of about 2 s (20 refreshes of the emulated
# GPUs' energy counter, which refreshes every 100 ms like a real one's), about 13 rounds.
BASE_STEPS, PERSEUS_STEPS = 12, 70
# Instructions of 10-80 ms: the host's ms of overhead per gloo hop and wake-up stay a small
# share of the iteration (at 4 ms per layer they made the measured slowdown swing by 4 %).
MS_PER_LAYER = 10.0
MAX_MHZ = 1410  # the emulated A100's max SM clock


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("perseus")
    out = {}
    for name, steps, args in (
        ("AllMaxFrequency", BASE_STEPS, {}),
        ("Perseus", PERSEUS_STEPS, {"freq_step": 10, "max_slowdown": 0.01}),
    ):
        spec = DemoJob(
            nproc=4,
            layers=LAYERS,
            microbatches=M,
            steps=steps,
            nominal_ms_per_layer=MS_PER_LAYER,
        )
        with Coordinator(
            scheduler=name,
            scheduler_args={"num_microbatches": M, **args},
            dump_dir=tmp / name / "dump",
            log_path=tmp / name / "coordinator.log",
            env={"PERSEUS_DUMP_DATA": "true"},
        ) as coordinator:
            status, traces, log = run_job(tmp, spec, coordinator, name=name)
            assert status == 0, log
            out[name] = (traces, coordinator.job_dirs())
    return out


def _steady(traces, key):
    """Per step: iteration time = slowest rank, energy = sum over ranks; the last steps."""
    steps = [steps_of(traces[r]) for r in sorted(traces)]
    reduce = max if key == "iter_time_s" else sum
    return [reduce(s[i][key] for s in steps) for i in range(len(steps[0]))][-MEASURED:]


def _deployed(runs):
    """The Perseus job's deployed plan, its solver problem and the all-max frequencies."""
    (job_dir,) = runs["Perseus"][1]
    plan = load_plan(job_dir / "deployed_plan.json")
    profile = load_profile(job_dir / "instruction_profile.csv")
    schedule = plan.pipeline_schedule()
    pp = pipeline_problem(profile, schedule, plan.p2p_power)
    return plan, pp, max_frequencies(profile, schedule)


def test_switching_the_scheduler_switches_behaviour(runs):
    allmax, _ = runs["AllMaxFrequency"]
    perseus, _ = runs["Perseus"]
    order = make_schedule("1f1b", 4, M).kinds()
    for rank, records in allmax.items():
        for step in range(BASE_STEPS):
            assert executed(records, step) == [(k, MAX_MHZ) for k in order[rank]]
    lowered = {
        rank: sum(f < MAX_MHZ for _, f in executed(records, PERSEUS_STEPS - 1))
        for rank, records in perseus.items()
    }
    assert sum(lowered.values()) > 0, lowered


def test_perseus_deploys_a_plan_that_saves_energy_without_slowing_down(runs):
    traces, job_dirs = runs["Perseus"]
    (job_dir,) = job_dirs
    plan = load_plan(job_dir / "deployed_plan.json")
    profile = load_profile(job_dir / "instruction_profile.csv")
    schedule = plan.pipeline_schedule()
    # The plan, by the exact accounting on the profile the job measured.
    all_max = evaluate(profile, schedule, max_frequencies(profile, schedule), plan.p2p_power)
    mine = evaluate_plan(profile, plan)
    assert mine.energy_j <= 0.95 * all_max.energy_j
    assert mine.iteration_time_s <= 1.01 * all_max.iteration_time_s
    # The steady-state steps really ran that plan, instruction by instruction.
    for rank, records in traces.items():
        for step in range(PERSEUS_STEPS - MEASURED, PERSEUS_STEPS):
            assert executed(records, step) == [tuple(x) for x in plan.frequencies[rank]]


def test_measured_energy_and_time_against_all_max(runs):
    base_t = _steady(runs["AllMaxFrequency"][0], "iter_time_s")
    base_e = _steady(runs["AllMaxFrequency"][0], "iter_energy_j")
    pers_t = _steady(runs["Perseus"][0], "iter_time_s")
    pers_e = _steady(runs["Perseus"][0], "iter_energy_j")
    saved = 1 - statistics.median(pers_e) / statistics.median(base_e)
    slowdown = statistics.median(pers_t) / statistics.median(base_t) - 1
    assert saved >= 0.05, (saved, base_e, pers_e)
    # The model passes activations between ranks in zero time; here every gloo hop costs a
    # few ms of two processes on a shared 2-core host, which the all-max run measures
    # (`perseus.planning.hops`). With it, the plan that fits the 1 % budget in the model is
    # predicted to run ~2 % slower than all-max: the measured slowdown is held to that
    # prediction, plus the wider of the two runs' own step-to-step spread.
    plan, pp, all_max = _deployed(runs)
    hop_s = calibrate_hop_latency(pp, all_max, statistics.median(base_t))
    assert hop_s < 0.01, hop_s  # a gloo hop on loopback is ms, not tens of ms
    plan_s, all_max_s = hop_times(pp, [plan.stage_frequencies(), all_max], hop_s)
    predicted = max(plan_s / all_max_s - 1, 0.01)
    jitter = max((max(t) - min(t)) / statistics.median(t) for t in (base_t, pers_t))
    assert slowdown <= predicted + jitter, (slowdown, predicted, hop_s, jitter, base_t, pers_t)


def test_hop_latency_explains_the_all_max_time(runs):
    """The calibration is what the test above leans on: at the calibrated latency the model
    gives the measured all-max time, and without it the model is faster than measured."""
    base_t = statistics.median(_steady(runs["AllMaxFrequency"][0], "iter_time_s"))
    plan, pp, all_max = _deployed(runs)
    (free,) = hop_times(pp, [all_max], 0.0)
    assert free == evaluate(pp.profile, pp.schedule, all_max, plan.p2p_power).iteration_time_s
    assert free < base_t  # the host's overhead is real
    hop_s = calibrate_hop_latency(pp, all_max, base_t)
    assert hop_s > 0
    assert hop_times(pp, [all_max], hop_s)[0] == pytest.approx(base_t, rel=1e-9)


def test_artifacts_are_written(runs):
    _, job_dirs = runs["Perseus"]
    frontier = Path(job_dirs[0]) / "frontier"
    assert (frontier / "frontier.csv").is_file()
