"""End to end: README's deploy commands (`perseus.train` under Perseus) keep the promise.

Exactly what README's "Deploy it in your training job" runs on a machine without GPUs: the
coordinator with only ``--max-slowdown 0.01`` and the example job under torchrun (4 ranks,
gloo) on emulated A100s at their default 15 ms clock switch, with nominal instruction times
(``PERSEUS_EMULATE_NOMINAL=1``: each layer's forward takes ``--nominal-ms-per-layer`` at the
max clock, so a busy CPU does not move the figures). The layer split 2,4,3,1 is
imbalanced: stage 1 sets the pace, the others have slack Perseus turns into energy savings.
The job measures its own all-max rounds first; its report compares the plan with them.

The tolerances are fixed (docs/deploy.md, "How numbers are checked"): the plan's measured slowdown
is at most the 1 % budget plus `SLOWDOWN_TOLERANCE`, its measured saving within
`SAVING_TOLERANCE` of the predicted one; nothing is widened by a run's own spread or by a
latency fitted to the same run.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from e2e_fixtures import (
    Coordinator,
    decisions,
    executed,
    last_decision_round,
    read_traces,
    require_torch,
    scheduler_under_test,
    torchrun_command,
)

from perseus.domain.schedule import make_schedule
from perseus.io.plan_file import load_plan
from perseus.planning.dump import read_dump

require_torch()

SCHEDULER, SCHEDULER_ENV = scheduler_under_test()  # Perseus; broken_plans to see checks fail

M = 4
STEPS = 250
BUDGET = 0.01
SLOWDOWN_TOLERANCE = 0.02
SAVING_TOLERANCE = 0.02
MAX_MHZ = 1410  # the emulated A100's max SM clock
README_JOB = ["--layers", "2,4,3,1", "--microbatches", str(M), "--nominal-ms-per-layer", "8"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("perseus")
    with Coordinator(
        scheduler=SCHEDULER,
        scheduler_args={"max_slowdown": BUDGET},
        dump_dir=tmp / "dump",
        log_path=tmp / "coordinator.log",
        env={"PERSEUS_DUMP_DATA": "true", **SCHEDULER_ENV},
    ) as coordinator:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PERSEUS_", "ZEUS_"))}
        env |= {
            "ZEUS_GPU_BACKEND": "emulated",
            "PERSEUS_EMULATE_NOMINAL": "1",
            "PERSEUS_TRACE_DIR": str(tmp / "trace"),
        }
        args = ["--server-url", coordinator.url, *README_JOB, "--steps", str(STEPS)]
        done = subprocess.run(
            torchrun_command(4, args), env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr[-4000:]
        (job_dir,) = coordinator.job_dirs()
    return read_traces(tmp / "trace"), Path(job_dir)


def _events(job_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (job_dir / "promise.jsonl").read_text().splitlines()]


def test_the_job_first_runs_all_max_then_its_plan(run):
    traces, job_dir = run
    order = make_schedule("1f1b", 4, M).kinds()
    plan = load_plan(job_dir / "deployed_plan.json")
    decided = last_decision_round(job_dir)
    want = [[tuple(x) for x in rank] for rank in plan.frequencies]
    for rank, records in traces.items():
        for step in range(5):  # the warm-up and the all-max baseline rounds
            assert executed(records, step) == [(k, MAX_MHZ) for k in order[rank]]
        # Every round after it ran the plan, instruction by instruction, but for the all-max
        # reference round every 10th round (`reference_every`).
        after = [r for r in records if r["kind"] == "schedule" and r["round"] > decided]
        assert len(after) >= 10, (rank, decided, len(after))
        ran = [[tuple(x) for x in r["frequencies"]] for r in after]
        plan_rounds = [r for r in ran if r == want[rank]]
        assert len(plan_rounds) >= 0.8 * len(ran), (rank, ran)
    # The job deploys (README): a plan that lowers some clock, not all-max kept.
    assert decisions(job_dir)[0]["event"] == "deployed", _events(job_dir)
    assert any(f < MAX_MHZ for s in plan.stage_frequencies() for f in s)


def test_the_plan_keeps_its_promise_measured(run):
    _, job_dir = run
    events = decisions(job_dir)
    report = read_dump(job_dir).report
    assert report.measured_all_max is not None
    # README's job deploys: all-max kept ("held") fails here, as does a fall-back.
    assert events[0]["event"] == "deployed", _events(job_dir)
    assert not [e for e in events if e["event"] in ("held", "fallback")], events
    assert report.measured_slowdown is not None and report.measured_saving is not None
    assert report.predicted_slowdown is not None and report.predicted_saving is not None
    assert report.predicted_slowdown <= BUDGET + 1e-9
    assert report.measured_slowdown <= BUDGET + SLOWDOWN_TOLERANCE, report
    assert report.measured_saving > 0, report
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
