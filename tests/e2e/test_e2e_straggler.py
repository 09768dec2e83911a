"""End to end: a straggler announcement changes the other pipelines' plans (dp = 2), and
only the stage leaders talk to the coordinator.

Two data-parallel pipelines of two stages each (4 ranks under torchrun). After Perseus has
deployed its plan, pipeline 1 turns 1.3× slower (emulated) and rank 0 announces it
(``POST /straggler``): from that step on, pipeline 0 runs a slower, cheaper plan, since it
would only wait for pipeline 1 at the gradient all-reduce anyway; pipeline 1 keeps its plan.

Pipeline 0's ranks (0 and 1) lead their stages: they alone register, report and ask
(the coordinator's request counters), and pipeline 1's ranks run, every round, the list
their stage leader handed out for their replica (their traces against their leader's).
"""

from __future__ import annotations

from e2e_fixtures import (
    Coordinator,
    DemoJob,
    executed,
    request_counts,
    require_torch,
    run_job,
    runs_its_leaders_schedules,
)

require_torch()

STEPS, AT = 160, 150  # profiling rounds last about 2 s (20 counter refreshes): ~14 steps
PP = 2


def test_straggler_announcement_slows_the_other_pipeline(tmp_path):
    spec = DemoJob(
        nproc=4,
        layers="1,3",
        microbatches=4,
        steps=STEPS,
        extra_args=("--straggler", f"1:1.3:{AT}"),
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
    ) as coordinator:
        status, traces, log = run_job(tmp_path, spec, coordinator)
        requests = request_counts(coordinator.url)
    assert status == 0, log
    # Only the two leaders talk: one registration each, one result and one schedule per
    # round each (and the first schedule).
    # (A profiling round may hold several steps: sweep rounds last at least 0.5 s.)
    rounds = runs_its_leaders_schedules(traces)
    assert 0 < rounds <= STEPS
    assert requests[("/register_rank/{job_id}", "POST")] == PP
    assert requests[("/result/{job_id}", "POST")] == PP * rounds
    assert requests[("/schedule/{job_id}", "GET")] == PP * (rounds + 1)

    def freqs(rank, step):
        return [f for _, f in executed(traces[rank], step)]

    for stage in range(PP):
        pipe0, pipe1 = stage, PP + stage  # rank = dp_rank · pp_degree + pp_rank
        # Before the announcement both pipelines run the same, settled plan.
        before = freqs(pipe0, AT - 1)
        assert before == freqs(pipe0, AT - 2) == freqs(pipe1, AT - 1)
        # The straggling pipeline keeps it.
        assert all(freqs(pipe1, s) == before for s in range(AT, STEPS))
    changed = 0
    for stage in range(PP):
        before = freqs(stage, AT - 1)
        for step in range(AT, STEPS):
            after = freqs(stage, step)
            assert all(a <= b for a, b in zip(after, before, strict=True)), (stage, before, after)
            changed += after != before
    assert changed > 0
