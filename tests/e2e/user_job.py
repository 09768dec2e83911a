"""A training job written the way a user would, with Perseus attached (run by torchrun).

``torchrun --nproc-per-node 4 tests/e2e/user_job.py --server-url http://127.0.0.1:PORT
--hidden 384 --layers 2,4,3,1 --steps 60``

A small MLP regression model cut into one stage per rank (``--layers``: Linear+GELU blocks
per stage, deliberately uneven), torch's own `Schedule1F1B` with a loss, a `DataLoader`
over a synthetic dataset, AdamW with a step after every iteration, and one
`perseus.integrations.pipelining.attach` call. Nothing else of Perseus: no emulation
settings beyond what the environment says (the test sets ``ZEUS_GPU_BACKEND=emulated``, as
the README's deploy section does on a machine without GPUs). ``--hidden`` sets the
instruction length: 384 gives milliseconds per instruction, 16 gives microseconds.
"""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
from torch.utils.data import DataLoader, TensorDataset

from perseus.integrations.pipelining import attach


def make_stage(hidden: int, blocks: int, last: bool) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(blocks):
        layers += [nn.Linear(hidden, hidden), nn.GELU()]
    if last:
        layers.append(nn.Linear(hidden, 1))
    return nn.Sequential(*layers)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--server-url", required=True)
    p.add_argument("--hidden", type=int, default=384)
    p.add_argument("--batch", type=int, default=64, help="microbatch size")
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--layers", default="2,4,3,1")
    p.add_argument("--steps", type=int, default=60)
    args = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank, ranks = dist.get_rank(), dist.get_world_size()
    blocks = [int(x) for x in args.layers.split(",")]
    torch.manual_seed(rank)
    module = make_stage(args.hidden, blocks[rank], last=rank == ranks - 1)
    stage = PipelineStage(module, rank, ranks, torch.device("cpu"))
    schedule = Schedule1F1B(stage, n_microbatches=args.microbatches, loss_fn=nn.functional.mse_loss)
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3)

    batch = args.batch * args.microbatches
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(8 * batch, args.hidden, generator=generator)
    y = x[:, :1].sin()
    loader = DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=True, drop_last=True)

    done = 0
    with attach(schedule, server_url=args.server_url, job_metadata="user-job"):
        while done < args.steps:
            for xb, yb in loader:
                optimizer.zero_grad()
                if rank == 0:
                    schedule.step(xb)
                elif rank == ranks - 1:
                    losses: list[torch.Tensor] = []
                    schedule.step(target=yb, losses=losses)
                else:
                    schedule.step()
                optimizer.step()
                done += 1
                if done == args.steps:
                    break
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: {done} step(s) done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
