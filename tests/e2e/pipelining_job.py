"""A tiny `torch.distributed.pipelining` job with Perseus attached (run by torchrun).

``torchrun --nproc-per-node 4 tests/e2e/pipelining_job.py --case ScheduleInterleaved1F1B,2,8
--case ScheduleGPipe,1,4,eval --steps 2 --server-url http://127.0.0.1:PORT --trace-root DIR``

The cases run one after the other in the same processes (one launch: starting torch in four
processes takes most of a small job's time), each its own Perseus job.

Each virtual stage is one ``Linear + Tanh`` (hidden 16); stages are laid out as the schedule
class expects: one per rank (single-stage schedules), looped (stage ``rank + k·ranks``) or
V-shaped (``rank`` and ``2·ranks − 1 − rank``). Every rank calls ``schedule.step(x,
target=y)`` unchanged; ``eval`` in a case adds one ``schedule.eval(x)`` after training (it
must pass through unmeasured). Each case's traces go to ``TRACE_ROOT/NAME``.
"""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining import schedules as torch_schedules

from perseus.integrations.pipelining import attach

HIDDEN = 16
V_SHAPED = ("ScheduleZBVZeroBubble", "ScheduleDualPipeV")


def stage_indices(schedule: str, rank: int, ranks: int, chunks: int) -> list[int]:
    if schedule in V_SHAPED:
        return [rank, 2 * ranks - 1 - rank]
    return [rank + k * ranks for k in range(chunks)]


def run_case(case: str, args: argparse.Namespace, rank: int, ranks: int) -> int:
    """One schedule class's job (``NAME,CHUNKS,MICROBATCHES[,eval]``): its own Perseus job,
    traced under ``<trace root>/NAME``; returns the steps the hook counted."""
    name, chunks_text, microbatches_text, *flags = case.split(",")
    microbatches = int(microbatches_text)
    cls = getattr(torch_schedules, name)
    single = issubclass(cls, torch_schedules.PipelineScheduleSingle)
    chunks = 1 if single else int(chunks_text)
    num_stages = ranks * chunks
    stages = []
    for index in stage_indices(name, rank, ranks, chunks):
        torch.manual_seed(index)
        module = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.Tanh())
        stages.append(PipelineStage(module, index, num_stages, torch.device("cpu")))
    schedule = cls(
        stages[0] if single else stages,
        n_microbatches=microbatches,
        loss_fn=nn.functional.mse_loss,
    )
    params = [q for stage in stages for q in stage.submod.parameters()]
    optimizer = torch.optim.SGD(params, lr=0.01)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2 * microbatches, HIDDEN, generator=generator)
    y = torch.randn(2 * microbatches, HIDDEN, generator=generator)
    options = {} if args.trace_root is None else {"trace_dir": f"{args.trace_root}/{name}"}
    with attach(
        schedule, server_url=args.server_url, job_metadata="pipelining", **options
    ) as perseus:
        for _ in range(args.steps):
            optimizer.zero_grad()
            schedule.step(x, target=y)
            optimizer.step()
        if "eval" in flags:
            schedule.eval(x, target=y)
        steps = perseus.hook.step
    dist.barrier()
    print(f"rank {rank}: {steps} step(s) of {name} done", flush=True)
    return steps


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument(
        "--case",
        action="append",
        required=True,
        help="NAME,CHUNKS,MICROBATCHES[,eval], once per schedule class (run in turn)",
    )
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--server-url", required=True)
    p.add_argument("--trace-root", default=None, help="each case traces under TRACE_ROOT/NAME")
    args = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, ranks = dist.get_rank(), dist.get_world_size()
    ok = all([run_case(case, args, rank, ranks) == args.steps for case in args.case])
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
