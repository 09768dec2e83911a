"""End to end: a pp 2 × tp 2 job whose stage leaders alone talk to the coordinator.

Four ranks under torchrun (gloo, emulated GPUs): two pipeline stages of two tensor ranks
each (`perseus.train --tp-degree 2`; the tensor ranks stand in for a tensor-parallel group),
attached through a `DeviceMesh` (``--device-mesh``: attach() reads the place from its
dimensions). Perseus profiles online and deploys a plan; each stage's tensor-rank-0 process
leads: only the leaders register, report and ask, and the other tensor rank runs, every
round, the list its leader handed out. A non-leader that calls the coordinator directly is
refused with a 422 naming the rule.
"""

from __future__ import annotations

import httpx
from e2e_fixtures import (
    Coordinator,
    DemoJob,
    executed,
    request_counts,
    require_torch,
    run_job,
    runs_its_leaders_schedules,
)

from perseus.io.plan_file import load_plan

require_torch()

STEPS = 10
PP, TP = 2, 2


def test_a_tensor_parallel_job_deploys_a_plan_through_its_leaders(tmp_path):
    # Instructions of 16 and 48 ms: long enough beside the GPUs' 15 ms clock switch that the
    # plan slows the light stage.
    spec = DemoJob(
        nproc=PP * TP,
        layers="2,6",
        nominal_ms_per_layer=8.0,
        microbatches=4,
        steps=STEPS,
        extra_args=("--tp-degree", str(TP), "--device-mesh"),
        # The fan-out is under test, not measurement: ideal sensors, one round per step.
        env={"ZEUS_EMULATED_SENSORS": "ideal"},
    )
    with Coordinator(
        scheduler="Perseus",
        # No all-max baseline rounds (nor the guard's reference rounds): the plan deploys
        # after the profiling sweep, by step 6.
        scheduler_args={
            "num_microbatches": 4,
            "freq_step": 20,
            "max_slowdown": 0.01,
            "baseline_rounds": 0,
        },
        dump_dir=tmp_path / "dump",
        log_path=tmp_path / "coordinator.log",
        env={"PERSEUS_DUMP_DATA": "true"},
    ) as coordinator:
        status, traces, log = run_job(tmp_path, spec, coordinator)
        requests = request_counts(coordinator.url)
        job = next(x for x in traces[0] if x["kind"] == "job")
        # A non-leader (stage 0's tensor rank 1) that calls the coordinator itself.
        with httpx.Client(base_url=coordinator.url, timeout=10) as client:
            registered = client.post(
                f"/register_rank/{job['job_id']}",
                json={
                    "rank": 1,
                    "dp_rank": 0,
                    "pp_rank": 0,
                    "tp_rank": 1,
                    "available_frequencies": [1410],
                },
            )
            asked = client.get(f"/schedule/{job['job_id']}", params={"rank": 3})
    assert status == 0, log
    # rank = pp_rank · tp + tp_rank: ranks 0 and 2 lead stages 0 and 1.
    leaders = {
        r: next(x for x in records if x["kind"] == "job")["leader"] for r, records in traces.items()
    }
    assert leaders == {0: 0, 1: 0, 2: 2, 3: 2}
    # (A profiling round may hold several steps: sweep rounds last at least 0.5 s.)
    rounds = runs_its_leaders_schedules(traces)
    assert 0 < rounds <= STEPS
    assert requests[("/register_rank/{job_id}", "POST")] == PP
    assert requests[("/result/{job_id}", "POST")] == PP * rounds
    assert requests[("/schedule/{job_id}", "GET")] == PP * (rounds + 1)
    # The plan was deployed: in some step every tensor rank of a stage ran its stage's list.
    plan = load_plan(next((tmp_path / "dump").glob("*/deployed_plan.json")))
    stage_lists = plan.stage_frequencies()

    def ran_the_plan(step: int) -> bool:
        return all(
            [f for _, f in executed(traces[r], step)] == stage_lists[r // TP]
            for r in range(PP * TP)
        )

    assert any(ran_the_plan(step) for step in range(STEPS))
    assert len({f for stage in plan.stage_frequencies() for f in stage}) > 1
    for answer in (registered, asked):
        assert answer.status_code == 422, answer.text
    assert "Rank 1 (dp_rank 0, pp_rank 0, tp_rank 1) is not a leader of job" in registered.text
    assert "only the tensor-rank-0 process of data-parallel replica 0" in registered.text
    assert "Rank 3 is not a registered leader" in asked.text
