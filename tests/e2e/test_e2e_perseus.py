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
from perseus.planning import evaluate, evaluate_plan, max_frequencies

require_torch()

LAYERS = "2,4,3,1"
M = 4
MEASURED = 6  # steady-state steps compared
MAX_MHZ = 1410  # the emulated A100's max SM clock


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("perseus")
    out = {}
    for name, steps, args in (
        ("AllMaxFrequency", 8, {}),
        ("Perseus", 18, {"freq_step": 10, "max_slowdown": 0.01}),
    ):
        spec = DemoJob(nproc=4, layers=LAYERS, microbatches=M, steps=steps)
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


def test_switching_the_scheduler_switches_behaviour(runs):
    allmax, _ = runs["AllMaxFrequency"]
    perseus, _ = runs["Perseus"]
    order = make_schedule("1f1b", 4, M).kinds()
    for rank, records in allmax.items():
        for step in range(8):
            assert executed(records, step) == [(k, MAX_MHZ) for k in order[rank]]
    lowered = {
        rank: sum(f < MAX_MHZ for _, f in executed(records, 17))
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
        for step in range(18 - MEASURED, 18):
            assert executed(records, step) == [tuple(x) for x in plan.frequencies[rank]]


def test_measured_energy_and_time_against_all_max(runs):
    base_t = _steady(runs["AllMaxFrequency"][0], "iter_time_s")
    base_e = _steady(runs["AllMaxFrequency"][0], "iter_energy_j")
    pers_t = _steady(runs["Perseus"][0], "iter_time_s")
    pers_e = _steady(runs["Perseus"][0], "iter_energy_j")
    saved = 1 - statistics.median(pers_e) / statistics.median(base_e)
    slowdown = statistics.median(pers_t) / statistics.median(base_t) - 1
    # Wall-clock iteration times on a shared CPU jitter by a few percent between otherwise
    # identical steps (CI once saw a 0.45 % spread under AllMaxFrequency and 2.1 % under
    # Perseus). Allow the wider of the two runs' own spreads on top of the 1 % budget: a plan
    # that really ran several percent slower still fails.
    jitter = max((max(t) - min(t)) / statistics.median(t) for t in (base_t, pers_t))
    assert saved >= 0.05, (saved, base_e, pers_e)
    assert slowdown <= 0.01 + jitter, (slowdown, jitter, base_t, pers_t)


def test_artifacts_are_written(runs):
    _, job_dirs = runs["Perseus"]
    frontier = Path(job_dirs[0]) / "frontier"
    assert (frontier / "frontier.csv").is_file()
