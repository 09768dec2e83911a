"""End to end: `attach` inside real `torch.distributed.pipelining` schedules.

For every schedule class of torch 2.13, a real ``torchrun --nproc-per-node 4`` job (gloo,
emulated GPUs, `tests/e2e/pipelining_job.py`; the classes one after the other in one launch,
each its own Perseus job) trains a tiny model with Perseus attached to a real coordinator on
loopback (AllMaxFrequency). Every rank's executed instructions (stage,
kind, microbatch, from the hook's traces) must equal torch's own ``pipeline_order`` compute
actions, in order, in every step, and the job must finish.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_fixtures import Coordinator, read_traces, require_torch

require_torch()
from torch.distributed.pipelining import schedules as ts  # noqa: E402
from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops  # noqa: E402

RANKS = 4
STEPS = 2
JOB = Path(__file__).with_name("pipelining_job.py")
KINDS = {"F": "forward", "B": "backward", "I": "backward_input", "W": "backward_weight"}

# (schedule class, stages per rank, microbatches, also run schedule.eval()).
CASES = [
    ("ScheduleGPipe", 1, 4, True),
    ("Schedule1F1B", 1, 4, False),
    # Microbatches == ranks and 4 chunks per rank, in one run.
    ("ScheduleInterleaved1F1B", 4, 4, False),
    ("ScheduleLoopedBFS", 2, 4, False),
    ("ScheduleInterleavedZeroBubble", 2, 8, True),
    ("ScheduleZBVZeroBubble", 2, 8, False),
    # OVERLAP_F_B actions, run by torch one sub-action after the other.
    ("ScheduleDualPipeV", 2, 8, False),
]


def torch_compute_order(name: str, chunks: int, microbatches: int) -> list[list[tuple]]:
    """Each rank's (stage, kind, microbatch) from torch's own pipeline_order."""
    ops = get_schedule_ops(getattr(ts, name), RANKS, microbatches, num_stages_per_rank=chunks)

    def flat(action):  # type: ignore[no-untyped-def]
        if action is None:
            return []
        if action.sub_actions:
            return [a for sub in action.sub_actions for a in flat(sub)]
        kind = KINDS.get(action.computation_type.value)
        return [] if kind is None else [(action.stage_index, kind, action.microbatch_index)]

    orders = [[a for action in row for a in flat(action)] for row in ops]
    if name == "Schedule1F1B":
        # torch 2.13's Schedule1F1B._get_pipeline_order numbers the last rank's forwards
        # F1..FM (an off-by-one); its step runs F0..F(M-1), which attach registers.
        last = orders[-1]
        assert [m for _, k, m in last if k == "forward"] == list(range(1, microbatches + 1))
        orders[-1] = [(s, k, m - 1 if k == "forward" else m) for s, k, m in last]
    return orders


TOKEN = "e2e-token-0123456789abcdef"


@pytest.fixture(scope="module")
def every_case(tmp_path_factory):
    """Every case in one launch (their own Perseus jobs, one after the other), against a
    coordinator with a token: the trace root, the job's log, the coordinator's log and the
    jobs' dump directories."""
    tmp = tmp_path_factory.mktemp("pipelining")
    with Coordinator(
        scheduler="AllMaxFrequency",
        scheduler_args={},  # every job describes its own pipeline
        dump_dir=tmp / "dump",
        log_path=tmp / "coordinator.log",
        env={"PERSEUS_TOKEN": TOKEN, "PERSEUS_DUMP_DATA": "true"},
    ) as c:
        log = launch(tmp / "trace", c.url, CASES, token=TOKEN)
        job_dirs = c.job_dirs()
    return tmp / "trace", log, (tmp / "coordinator.log").read_text(), job_dirs


@pytest.mark.parametrize(("name", "chunks", "microbatches", "with_eval"), CASES)
def test_executed_order_is_torchs_pipeline_order(every_case, name, chunks, microbatches, with_eval):
    trace_root, log, _, _ = every_case
    assert f"{STEPS} step(s) of {name} done" in log
    check_order(trace_root / name, name, chunks, microbatches, log)


def test_the_jobs_ran_against_a_coordinator_with_a_token(every_case):
    """PERSEUS_TOKEN on the coordinator and the ranks: every rank presents it, and rank 0
    passes the job credential to the others (else their requests would get 403)."""
    _, log, coordinator_log, job_dirs = every_case
    assert len(job_dirs) == len(CASES)
    for job_dir in job_dirs:
        assert '"token_sha256":"' in (job_dir / "job.json").read_text()
        # attach()'s normal close ended the job: finished, never failed (rank 0 sent the
        # job's credential with POST /finish after every rank had closed).
        assert (job_dir / "finished").is_file() and not (job_dir / "failed").exists()
    assert TOKEN not in log and TOKEN not in coordinator_log


def launch(trace_root, url, cases, token=None) -> str:
    """Run `cases` in one torchrun job; returns its log (it must succeed)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PERSEUS_", "ZEUS_"))}
    env.update(
        ZEUS_GPU_BACKEND="emulated",
        PERSEUS_EMULATE_STRETCH="0",  # measure only: the order is under test, not clocks
        OMP_NUM_THREADS="1",
    )
    if token is not None:
        env["PERSEUS_TOKEN"] = token
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", str(RANKS), "--max-restarts", "0", str(JOB),
        "--steps", str(STEPS), "--server-url", url, "--trace-root", str(trace_root),
    ]  # fmt: skip
    for name, chunks, microbatches, with_eval in cases:
        cmd += ["--case", f"{name},{chunks},{microbatches}" + (",eval" if with_eval else "")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-6000:]
    return log


def check_order(trace_dir, name, chunks, microbatches, log) -> None:
    """Every rank's executed order, in every step, is torch's own for the case."""
    expected = torch_compute_order(name, chunks, microbatches)
    traces = read_traces(trace_dir)
    assert sorted(traces) == list(range(RANKS))
    for rank, records in traces.items():
        steps = [r for r in records if r["kind"] == "step"]
        assert len(steps) == STEPS, (rank, log[-6000:])  # eval() is not an iteration
        for step in range(STEPS):
            executed = [
                (r["stage"], r["instruction"], r["microbatch"])
                for r in records
                if r["kind"] == "instruction" and r["step"] == step
            ]
            assert executed == expected[rank], (name, rank, step)
