"""A 1F1B job of sub-millisecond instructions with Perseus attached (run by torchrun).

``torchrun --nproc-per-node 4 tests/e2e/short_instructions_job.py --microbatches 8
--rounds-after 8 --max-steps 2000 --server-url http://127.0.0.1:PORT``

Each stage is one ``Linear + Tanh`` (hidden 16: tens of microseconds of CPU); its emulated
time comes from ``PERSEUS_EMULATE_NOMINAL_MS`` (the test gives uneven, sub-millisecond
stages). The coordinator sizes its rounds in time (enough refreshes of the energy counter),
so how many steps profiling takes depends on how fast this machine runs the iterations: the
job runs until Perseus has decided (rank 0's round status leaves ``profiling``) and then
`--rounds-after` more rounds, or `--max-steps`, whichever comes first. Rank 0 decides and
tells the others after every step (one tiny broadcast), so all ranks stop at the same step.
"""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import Schedule1F1B

from perseus.integrations.pipelining import attach

HIDDEN = 16


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--rounds-after", type=int, default=8)
    p.add_argument("--max-steps", type=int, default=2000)
    p.add_argument("--server-url", required=True)
    args = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, ranks = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    module = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.Tanh())
    stage = PipelineStage(module, rank, ranks, torch.device("cpu"))
    schedule = Schedule1F1B(stage, n_microbatches=args.microbatches, loss_fn=nn.functional.mse_loss)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2 * args.microbatches, HIDDEN, generator=generator)
    y = torch.randn(2 * args.microbatches, HIDDEN, generator=generator)

    decided: int | None = None
    stop = torch.zeros(1, dtype=torch.int64)
    with attach(schedule, server_url=args.server_url, job_metadata="short") as perseus:
        hook = perseus.hook
        for _ in range(args.max_steps):
            optimizer.zero_grad()
            schedule.step(x, target=y)
            optimizer.step()
            if rank == 0:
                status = hook.status
                if decided is None and status is not None and status.phase != "profiling":
                    decided = hook.round
                done = decided is not None and hook.round >= decided + args.rounds_after
                stop[0] = int(done)
            dist.broadcast(stop, src=0)
            if stop.item():
                break
        steps = hook.step
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: {steps} step(s) done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
