"""End to end on a job shape no other test runs: the profile meets the fidelity targets
against the emulator's truth, and the deployed plan saves what it predicted.

The job (`perseus.train`, torch's ``ScheduleZBVZeroBubble``: 3 pipeline ranks, two stages
each in a V, the backward split into its input and weight halves) has stages of 1 to 3
layers (3× imbalance), each layer's forward a nominal `MS_PER_LAYER` at the max clock
(``PERSEUS_EMULATE_NOMINAL``), on emulated A100s with their default sensors (an energy counter
refreshing every 100 ms, sampling the last 25 % of its period, read at a cost, with power that
decays after work stops). The coordinator gets only ``{"max_slowdown": BUDGET}``. No part of
the product was tuned on this shape.

Checked against the emulator's truth (``PERSEUS_EMULATE_TRUTH``: the model's time and energy
per executed instruction; nothing in the product reads it), over every row of the profile the
scheduler built whose (stage, kind, clock) ran clear of a clock change at least once, with the
targets of the fidelity benchmark (`bench_profile_fidelity.py`): energy error median ≤ 1.5 %,
p95 ≤ 4 %, max ≤ 10 %; the truth within 2 stated standard errors of ≥ 90 % of the rows. **Not
all met today** (marked `xfail(strict=True)`, so that meeting them fails the run until the
mark goes): the p95 is missed, the median and the max are met in some runs and not in
others (the figures: the mark's reason). Its 5 ms instructions alternate kinds at different
clocks faster than the 15 ms switch lands, so most sweep rounds run at clocks no rank can
know and give the power fit no windows (docs/profiling-notes.md, "A clock asked for before
the last one landed is unknown"); the rows left rest on fewer windows, within their stated
errors (coverage 100 %). Before, those rounds' seconds were charged to the clock asked for
just before: median 6.0–7.7 %, p95 25–35 %, max 44–65 %. No row's power lies outside
[idle, power limit] (met; before each row's energy was its fitted power times the row's own
time, one read 421 W).

Its rows' times are their clocks' (every instruction of a quarter of the rows starts while
a clock change lands: those rows are left out of the plan, docs/profiling-notes.md, "A
row's time is its clock's"); before they were kept, one plan ran +12.6 % slow for a
predicted +3.8 % and was withdrawn. The promise, which holds: the plan deploys and stays deployed, its measured slowdown is within
the budget + 2 points and its measured saving within 2 points of the predicted one
(docs/deploy.md, "How numbers are checked"): the halves' errors cancel in their sum.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from e2e_fixtures import (
    Coordinator,
    DemoJob,
    decisions,
    require_torch,
    run_job,
    scheduler_under_test,
    truth_of,
)

from perseus.io.profile_csv import read_profile_rows
from perseus.planning.dump import read_dump
from zeus_power.device import get_gpu_spec

require_torch()

pytestmark = pytest.mark.e2e

RANKS = 3
LAYERS = "1,2,3,2,1,3"  # stages 0..5: rank r holds stages r and 5 − r
MS_PER_LAYER = 5.0
MICROBATCHES = 6
STEPS = 260  # about 55 rounds of profiling (3 steps each), then about 30 of the plan
BUDGET = 0.05
TOLERANCE = 0.02
TARGETS = {"median": 0.015, "p95": 0.04, "max": 0.10, "coverage": 0.90}
SPEC = get_gpu_spec("A100-SXM")
SCHEDULER, SCHEDULER_ENV = scheduler_under_test()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("unseen-shape")
    truth_dir = tmp / "truth"
    spec = DemoJob(
        nproc=RANKS,
        schedule="zbv",
        layers=LAYERS,
        microbatches=MICROBATCHES,
        steps=STEPS,
        nominal_ms_per_layer=MS_PER_LAYER,
        env={"PERSEUS_EMULATE_TRUTH": str(truth_dir)},
    )
    with Coordinator(
        scheduler=SCHEDULER,
        scheduler_args={"max_slowdown": BUDGET},
        dump_dir=tmp / "dump",
        log_path=tmp / "coordinator.log",
        env={"PERSEUS_DUMP_DATA": "true", **SCHEDULER_ENV},
    ) as coordinator:
        status, _, log = run_job(tmp, spec, coordinator, timeout_s=400)
        assert status == 0, log
        (job_dir,) = coordinator.job_dirs()
    return job_dir, truth_of(truth_dir, clear_only=True)


def _rows(job_dir, truth):
    rows = read_profile_rows(job_dir / "instruction_profile.csv")
    assert rows and all(r.estimated for r in rows)
    keys = [(r.stage, r.instruction, r.frequency) for r in rows]
    judged = [(r, truth[key]) for r, key in zip(rows, keys, strict=True) if key in truth]
    assert len(judged) >= 0.75 * len(rows), (len(judged), len(rows))
    return judged


@pytest.mark.xfail(
    strict=True,
    reason="issue 48: the estimator misses the p95 target on this shape (runs of 2026-11-29 "
    "on this tree: energy error median 1.54 / 1.37 %, p95 5.83 / 5.30 %, max 10.8 / 9.5 %, "
    "coverage 100 / 100 %)",
)
def test_the_profile_meets_the_fidelity_targets_against_the_truth(run):
    job_dir, truth = run
    rows = _rows(job_dir, truth)
    errors = np.array([abs(r.energy / e - 1) for r, (_, e) in rows])
    covered = [
        r.energy_se is not None
        and math.isfinite(r.energy_se)
        and abs(r.energy - e) <= 2 * r.energy_se
        for r, (_, e) in rows
    ]
    figures = {
        "rows": len(rows),
        "median": float(np.median(errors)),
        "p95": float(np.percentile(errors, 95)),
        "max": float(errors.max()),
        "coverage": float(np.mean(covered)),
    }
    assert figures["median"] <= TARGETS["median"], figures
    assert figures["p95"] <= TARGETS["p95"], figures
    assert figures["max"] <= TARGETS["max"], figures
    assert figures["coverage"] >= TARGETS["coverage"], figures


def test_no_row_draws_what_a_gpu_cannot(run):
    job_dir, truth = run
    for r, _ in _rows(job_dir, truth):
        power = r.energy / r.time
        # At the cap a row's power is the limit, up to the float product time × power.
        assert SPEC.idle_power_w <= power <= SPEC.default_power_limit_w * (1 + 1e-9), (r, power)


def test_the_plan_deploys_and_saves_what_it_predicted(run):
    job_dir, _ = run
    events = decisions(job_dir)
    assert events and events[0]["event"] == "deployed", events
    assert not [e for e in events if e["event"] in ("held", "fallback")], events
    report = read_dump(job_dir).report
    assert report.predicted_saving is not None and report.predicted_saving > 0, report
    assert report.measured_saving is not None and report.measured_slowdown is not None, report
    assert report.measured_slowdown <= BUDGET + TOLERANCE, report
    assert abs(report.measured_saving - report.predicted_saving) <= TOLERANCE, report
