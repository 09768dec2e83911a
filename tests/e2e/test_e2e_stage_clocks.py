"""End to end: a job of sub-millisecond instructions deploys a per-stage plan within its budget.

The coordinator runs Perseus with ``{"max_slowdown": 0.1}``; the job
(`short_instructions_job.py`) is 1F1B on 4 ranks under ``torchrun`` (gloo) on emulated A40s
at their default 15 ms clock switch and 100 ms energy counter, with nominal emulated times
(``PERSEUS_EMULATE_NOMINAL``) for uneven stages whose forwards last 0.25, 0.75, 0.5 and
0.25 ms at the max clock (backwards twice that): far too short to time or plan one by one,
and the heaviest stage leaves the others slack. A40s, whose idle power is small beside what
they draw computing (30 W against ~400 W), so that a host's noise in the idle time between
instructions (4 ranks on 2 shared cores: most of each iteration) moves the job's energy
less than a per-stage plan saves. The all-max rounds show it; Perseus measures
the stages' clocks instead of the instructions' (`perseus.schedulers.perseus_scheduler.stage_clocks`), deploys the
plan that runs each stage at one clock, and guards it against the all-max rounds like any
plan. The job runs until Perseus has decided and then `ROUNDS_AFTER` more rounds (the
rounds are sized in time, so the steps they take depend on the machine).

`SLOWDOWN_TOLERANCE` is docs/deploy.md's ("How numbers are checked"); the saving is checked to be
positive, measured against the job's all-max rounds.

A host so busy that the all-max rounds' energy spreads more than half the predicted saving
holds all-max (the check every plan passes first, `perseus.schedulers.perseus_scheduler.checks.plan_problems`): no
saving could be verified there. That outcome, and only that one, skips the deployment's
checks, saying so, outside CI (under CI it fails); every other hold, and any plan that is not per stage, fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_fixtures import Coordinator, require_torch
from paths import ci_mode

from perseus.io.plan_file import load_plan
from perseus.planning.dump import read_dump

require_torch()

pytestmark = pytest.mark.e2e

BUDGET = 0.1
SLOWDOWN_TOLERANCE = 0.02
ROUNDS_AFTER = 7
MAX_MHZ = 1740  # the emulated A40's max SM clock
JOB = Path(__file__).with_name("short_instructions_job.py")
FORWARD_MS = (0.25, 0.75, 0.5, 0.25)
NOMINAL_MS = {
    f"{kind}@{stage}": factor * ms
    for stage, ms in enumerate(FORWARD_MS)
    for kind, factor in (("forward", 1), ("backward", 2))
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stage-clocks")
    with Coordinator(
        scheduler="Perseus",
        scheduler_args={"max_slowdown": BUDGET},
        dump_dir=tmp / "dump",
        log_path=tmp / "coordinator.log",
        env={"PERSEUS_DUMP_DATA": "true"},
    ) as coordinator:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PERSEUS_", "ZEUS_"))}
        env |= {
            "ZEUS_GPU_BACKEND": "emulated",
            "ZEUS_EMULATED_GPU": "A40",
            "PERSEUS_EMULATE_NOMINAL": "1",
            "PERSEUS_EMULATE_NOMINAL_MS": json.dumps(NOMINAL_MS),
        }
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "4",
            "--max-restarts",
            "0",
            str(JOB),
            "--microbatches",
            "8",
            "--rounds-after",
            str(ROUNDS_AFTER),
            "--max-steps",
            "4000",
            "--server-url",
            coordinator.url,
        ]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-4000:]
        (job_dir,) = coordinator.job_dirs()
    return done, Path(job_dir)


def _events(job_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (job_dir / "promise.jsonl").read_text().splitlines()]


def test_the_job_says_its_plans_are_per_stage_and_why(run):
    done, job_dir = run
    err = done.stderr
    assert "too short for per-instruction clocks; per-stage constant clocks instead" in err
    assert "(per-stage clock sweep)" in err
    assert (job_dir / "finished").exists()
    report = json.loads((job_dir / "profiling.json").read_text())
    assert report["plan_kind"] == "per-stage", report
    for stage in report["stage_clocks"]:
        ratios = stage["time_ratio"]
        assert ratios[0] == 1.0 and ratios == sorted(ratios), stage


def test_a_per_stage_plan_is_deployed_and_keeps_its_budget(run):
    _, job_dir = run
    events = _events(job_dir)
    decisive = [e for e in events if e["event"] in ("deployed", "move", "held", "fallback")]
    assert decisive, events
    first = decisive[0]
    if first["event"] == "held" and first["reason"].startswith("the plan's predicted saving"):
        # The only problem (a plan predicted faster than all-max would come first).
        assert "could not tell it from noise" in first["reason"], first
        assert "per-stage plans were tried" in first["reason"], first
        why = f"this host is too noisy to verify a saving: {first['reason']}"
        if ci_mode():  # CI's host runs one job at a time: there the plan must deploy
            pytest.fail(why)
        pytest.skip(why)
    assert first["event"] == "deployed", events
    assert "per-stage plan" in decisive[0]["reason"], decisive[0]
    assert decisive[0]["predicted_slowdown"] <= BUDGET + 1e-9
    assert decisive[0]["predicted_saving"] > 0
    plan = load_plan(job_dir / "deployed_plan.json")
    clocks = plan.stage_frequencies()
    assert all(len(set(stage)) == 1 for stage in clocks), clocks  # no switch in an iteration
    assert any(stage[0] < MAX_MHZ for stage in clocks), clocks
    report = read_dump(job_dir).report
    # What ran and why, in the messages below (the report alone does not say which plan).
    story = (report, [(e["round"], e["event"], e.get("reason")) for e in events])
    assert report.measured_all_max is not None and report.measured_slowdown is not None
    assert report.measured_slowdown <= BUDGET + SLOWDOWN_TOLERANCE, story
    if decisive[-1]["event"] in ("deployed", "move"):
        assert report.measured_saving is not None and report.measured_saving > 0, story
