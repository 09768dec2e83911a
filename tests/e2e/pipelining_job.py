"""A tiny `torch.distributed.pipelining` job with Perseus attached (run by torchrun).

``torchrun --nproc-per-node 4 tests/e2e/pipelining_job.py --schedule ScheduleInterleaved1F1B
--chunks 2 --microbatches 8 --steps 2 --server-url http://127.0.0.1:PORT``

Each virtual stage is one ``Linear + Tanh`` (hidden 16); stages are laid out as the schedule
class expects: one per rank (single-stage schedules), looped (stage ``rank + k·ranks``) or
V-shaped (``rank`` and ``2·ranks − 1 − rank``). Every rank calls ``schedule.step(x,
target=y)`` unchanged; ``--eval`` adds one ``schedule.eval(x)`` after training (it must
pass through unmeasured). Traces go to ``PERSEUS_TRACE_DIR``.
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


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--schedule", required=True)
    p.add_argument("--chunks", type=int, default=1)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--server-url", required=True)
    p.add_argument("--eval", action="store_true")
    args = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, ranks = dist.get_rank(), dist.get_world_size()
    cls = getattr(torch_schedules, args.schedule)
    single = issubclass(cls, torch_schedules.PipelineScheduleSingle)
    chunks = 1 if single else args.chunks
    num_stages = ranks * chunks
    stages = []
    for index in stage_indices(args.schedule, rank, ranks, chunks):
        torch.manual_seed(index)
        module = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.Tanh())
        stages.append(PipelineStage(module, index, num_stages, torch.device("cpu")))
    schedule = cls(
        stages[0] if single else stages,
        n_microbatches=args.microbatches,
        loss_fn=nn.functional.mse_loss,
    )
    params = [q for stage in stages for q in stage.submod.parameters()]
    optimizer = torch.optim.SGD(params, lr=0.01)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2 * args.microbatches, HIDDEN, generator=generator)
    y = torch.randn(2 * args.microbatches, HIDDEN, generator=generator)

    with attach(schedule, server_url=args.server_url, job_metadata="pipelining") as perseus:
        for _ in range(args.steps):
            optimizer.zero_grad()
            schedule.step(x, target=y)
            optimizer.step()
        if args.eval:
            schedule.eval(x, target=y)
        steps = perseus.hook.step
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: {steps} step(s) of {args.schedule} done", flush=True)
    return 0 if steps == args.steps else 1


if __name__ == "__main__":
    sys.exit(main())
