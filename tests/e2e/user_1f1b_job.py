"""A user's pipeline-parallel training job, written as torch's documentation shows, with
Perseus attached by one call (run by torchrun; `tests/e2e/test_e2e_sensors.py`).

``torchrun --nproc-per-node 4 tests/e2e/user_1f1b_job.py --steps 60 --server-url URL``

Each rank holds one stage of a small MLP; torch's `Schedule1F1B` runs the microbatches, an
AdamW step follows every iteration, and rank 0 logs the loss. Nothing here knows the GPUs
are emulated or how they measure energy: the test sets that up through the environment.
"""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

from perseus.integrations.pipelining import attach

HIDDEN = 64
MICROBATCHES = 4


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--server-url", required=True)
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    block = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, HIDDEN))
    stage = PipelineStage(block, rank, world_size, torch.device("cpu"))
    schedule = Schedule1F1B(stage, n_microbatches=MICROBATCHES, loss_fn=nn.functional.mse_loss)
    optimizer = torch.optim.AdamW(block.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(8 * MICROBATCHES, HIDDEN, generator=generator)
    targets = torch.randn(8 * MICROBATCHES, HIDDEN, generator=generator)

    with attach(schedule, server_url=args.server_url, job_metadata="user-1f1b"):
        for step in range(args.steps):
            optimizer.zero_grad()
            if stage.is_first:
                schedule.step(inputs)
            elif stage.is_last:
                losses: list[torch.Tensor] = []
                schedule.step(target=targets, losses=losses)
                if step % 10 == 0:
                    print(f"step {step}: loss {torch.stack(losses).mean().item():.4f}", flush=True)
            else:
                schedule.step()
            optimizer.step()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
