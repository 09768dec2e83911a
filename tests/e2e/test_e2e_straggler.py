"""End to end: a straggler announcement changes the other pipelines' plans (dp = 2).

Two data-parallel pipelines of two stages each (4 ranks under torchrun). After Perseus has
deployed its plan, pipeline 1 turns 1.3× slower (emulated) and rank 0 announces it
(``POST /straggler``): from that step on, pipeline 0 runs a slower, cheaper plan, since it
would only wait for pipeline 1 at the gradient all-reduce anyway; pipeline 1 keeps its plan.
"""

from __future__ import annotations

from e2e_fixtures import Coordinator, DemoJob, executed, require_torch, run_job

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
    )
    with Coordinator(
        scheduler="Perseus",
        scheduler_args={"num_microbatches": 4, "freq_step": 20, "max_slowdown": 0.01},
        dump_dir=tmp_path / "dump",
        log_path=tmp_path / "coordinator.log",
    ) as coordinator:
        status, traces, log = run_job(tmp_path, spec, coordinator)
    assert status == 0, log

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
