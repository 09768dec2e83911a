"""End to end: a 4-rank torchrun job under Perseus keeps its promise, measured.

Real coordinator process on loopback, real torchrun with gloo, emulated GPUs (nominal
instruction times; see `tests/e2e_fixtures.py`) at their default 15 ms clock switch. The
layer split 2,4,3,1 is imbalanced: stage 1 sets the pace, the others have slack Perseus
turns into energy savings. The job measures its own all-max rounds first, so its report
compares the plan with the same job at all-max.

The tolerances are fixed (README, "How numbers are checked"): the plan's measured slowdown
is at most the 1 % budget plus `SLOWDOWN_TOLERANCE`, its measured saving within
`SAVING_TOLERANCE` of the predicted one; nothing is widened by a run's own spread or by a
latency fitted to the same run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e_fixtures import Coordinator, DemoJob, executed, require_torch, run_job

from perseus.domain.schedule import make_schedule
from perseus.io.plan_file import load_plan
from perseus.planning.dump import read_dump

require_torch()

LAYERS = "2,4,3,1"
M = 4
STEPS = 45
BUDGET = 0.01
SLOWDOWN_TOLERANCE = 0.02
SAVING_TOLERANCE = 0.02
# Instructions of 10-80 ms: the host's ms of overhead per gloo hop and wake-up stay a small
# share of the iteration.
MS_PER_LAYER = 10.0
MAX_MHZ = 1410  # the emulated A100's max SM clock


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("perseus")
    spec = DemoJob(
        nproc=4, layers=LAYERS, microbatches=M, steps=STEPS, nominal_ms_per_layer=MS_PER_LAYER
    )
    with Coordinator(
        scheduler="Perseus",
        scheduler_args={"num_microbatches": M, "freq_step": 10, "max_slowdown": BUDGET},
        dump_dir=tmp / "dump",
        log_path=tmp / "coordinator.log",
        env={"PERSEUS_DUMP_DATA": "true"},
    ) as coordinator:
        status, traces, log = run_job(tmp, spec, coordinator, name="Perseus")
        assert status == 0, log
        (job_dir,) = coordinator.job_dirs()
    return traces, Path(job_dir)


def _events(job_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (job_dir / "promise.jsonl").read_text().splitlines()]


def test_the_job_first_runs_all_max_then_its_plan(run):
    traces, job_dir = run
    order = make_schedule("1f1b", 4, M).kinds()
    plan = load_plan(job_dir / "deployed_plan.json")
    for rank, records in traces.items():
        for step in range(5):  # the warm-up and the all-max baseline rounds
            assert executed(records, step) == [(k, MAX_MHZ) for k in order[rank]]
        for step in range(STEPS - 10, STEPS):  # the plan, instruction by instruction
            assert executed(records, step) == [tuple(x) for x in plan.frequencies[rank]]
    assert any(f < MAX_MHZ for s in plan.stage_frequencies() for f in s)


def test_the_plan_keeps_its_promise_measured(run):
    _, job_dir = run
    events = _events(job_dir)
    assert [e["event"] for e in events if e["event"] != "check"] == ["deployed"], events
    report = read_dump(job_dir).report
    assert report.measured_slowdown is not None and report.measured_saving is not None
    assert report.predicted_slowdown is not None and report.predicted_saving is not None
    assert report.predicted_slowdown <= BUDGET + 1e-9
    assert report.measured_slowdown <= BUDGET + SLOWDOWN_TOLERANCE, report
    assert report.measured_saving >= 0.05, report
    assert report.measured_saving == pytest.approx(report.predicted_saving, abs=SAVING_TOLERANCE)


def test_the_plan_counts_the_costs_the_job_measured(run):
    _, job_dir = run
    plan = load_plan(job_dir / "deployed_plan.json")
    base = load_plan(job_dir / "baseline_plan.json")
    # Each rank timed its emulated GPU's clock switch (15 ms by default), and the all-max
    # rounds' P2P and host time went into the hop latency: both are in the plan's numbers.
    assert plan.switch_latency == pytest.approx(0.015, abs=0.005)
    assert 0 < plan.hop_latency < 0.01
    assert base.hop_latency == plan.hop_latency
    # Calibrated so that the model's all-max time is the job's measured one.
    report = read_dump(job_dir).report
    assert report.measured_all_max is not None
    assert base.iteration_time == pytest.approx(report.measured_all_max.iteration_time_s, rel=0.02)


def test_artifacts_are_written(run):
    _, job_dir = run
    frontier = job_dir / "frontier"
    assert (frontier / "frontier.csv").is_file()
    assert (job_dir / "instruction_profile.csv").is_file()
    assert (job_dir / "finished").is_file()
