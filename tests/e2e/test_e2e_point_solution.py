"""End to end: `PointSolution` makes every emulated GPU run exactly the plan, in order.

The plan gives each instruction its own frequency; each rank's trace records the SM clock
its emulated GPU was locked to while each instruction ran, with torch's schedule
(``Schedule1F1B``) and with the hand-written loop that calls the low-level hook
(``--loop manual``, `perseus.train.manual`). A plan for another microbatch count does not
fit the pipeline the job described at registration: a clear error before the first step.
"""

from __future__ import annotations

import pytest
from e2e_fixtures import Coordinator, DemoJob, executed, require_torch, run_job

from perseus.domain.plan import Plan
from perseus.domain.schedule import make_schedule
from perseus.io.plan_file import load_plan, save_plan

require_torch()

FREQS = [[1410, 1005, 705, 1200], [810, 1395, 1110, 600]]


def _plan(path, microbatches, freqs):
    schedule = make_schedule("1f1b", 2, microbatches)
    plan = Plan(
        schedule="1f1b",
        num_stages=2,
        num_microbatches=microbatches,
        p2p_power=55.0,
        iteration_time=1.0,
        energy=1.0,
        frequencies=[
            [(i.kind, f) for i, f in zip(order, fs, strict=True)]
            for order, fs in zip(schedule.orders, freqs, strict=True)
        ],
    )
    save_plan(plan, path)
    return path


def _run_two_stage_job(tmp_path, plan_path, loop="torch"):
    """Run the 2-stage, 2-microbatch job for 3 steps under `PointSolution(plan_path)`."""
    with Coordinator(
        scheduler="PointSolution",
        scheduler_args={"solution_path": str(plan_path)},
        dump_dir=tmp_path / "dump",
        log_path=tmp_path / "coordinator.log",
    ) as coordinator:
        spec = DemoJob(nproc=2, layers="1,3", microbatches=2, steps=3, loop=loop)
        return run_job(tmp_path, spec, coordinator)


@pytest.mark.parametrize("loop", ["torch", "manual"])
def test_each_device_runs_the_plans_frequencies_in_order(tmp_path, loop):
    plan_path = _plan(tmp_path / "plan.json", 2, FREQS)
    status, traces, log = _run_two_stage_job(tmp_path, plan_path, loop)
    assert status == 0, log
    plan = load_plan(plan_path)
    for rank in (0, 1):
        for step in range(3):
            assert executed(traces[rank], step) == [tuple(x) for x in plan.frequencies[rank]]


def test_a_plan_for_another_pipeline_is_a_clear_error(tmp_path):
    freqs = [[1410] * 6, [1410] * 6]  # 3 microbatches: 6 instructions per stage
    plan_path = _plan(tmp_path / "plan.json", 3, freqs)
    status, traces, log = _run_two_stage_job(tmp_path, plan_path)
    assert status != 0
    assert (
        "The plan is for 1f1b with 3 microbatch(es), but the job runs Schedule1F1B with 2; "
        "deploy a plan made for the job's pipeline"
    ) in log
    assert all(not [r for r in t if r["kind"] == "step"] for t in traces.values())
