"""One rank of a small 1F1B job that drives the Perseus hook by hand (the life-cycle tests).

``python tests/integration/client/lifecycle_ranks.py --url URL --rank R --world 2
--master-port P --steps 12``: rank R of a `--world`-stage pipeline (one GPU per stage, an
`EmulatedGPU` with ideal sensors, in nominal mode), `--microbatches` microbatches, `--steps` iterations, one
round per step. `--slow-last-round S`: this rank sleeps S seconds before its last round (it
closes while the others wait for it). `--die-after K`: this rank exits abruptly after K
steps, closing nothing (a crashed rank). Rank 0 prints the coordinator's answer to the
job's finish as one JSON line (``finish: {...}``).
"""

from __future__ import annotations

import argparse
import os
import time

import torch.distributed as dist

from perseus.client import EmulationSettings, PerseusOptimizer
from perseus.domain.schedule import make_schedule
from perseus.protocol import ParallelLayout, PipelineSpec
from zeus_power.device.emulated import EmulatedGPU

NOMINAL_S = {"forward": 0.003, "backward": 0.006}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--master-port", type=int, required=True)
    p.add_argument("--microbatches", type=int, default=2)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--slow-last-round", type=float, default=0.0)
    p.add_argument("--die-after", type=int, default=None)
    args = p.parse_args()
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{args.master_port}",
        rank=args.rank,
        world_size=args.world,
    )
    schedule = make_schedule("1f1b", args.world, args.microbatches)
    order = schedule.orders[args.rank]
    with PerseusOptimizer.from_layout(
        ParallelLayout(dp_degree=1, pp_degree=args.world, tp_degree=1),
        rank=args.rank,
        pp_rank=args.rank,
        device_id=args.rank,
        server_url=args.url,
        job_metadata="lifecycle",
        pipeline=PipelineSpec.of(schedule),
        # Ideal sensors: the life cycle is under test. With a counter refreshing every
        # 100 ms, measuring these 40 ms iterations would take rounds of about 60 of them.
        gpu=EmulatedGPU(args.rank, sensors="ideal"),
        emulation=EmulationSettings(nominal=True),
        nominal_time_s=NOMINAL_S,
        timeout_s=10.0,
    ) as hook:
        for step in range(args.steps):
            if args.die_after is not None and step == args.die_after:
                os._exit(3)  # a crash: nothing is closed, nothing told
            if step == args.steps - 1 and args.slow_last_round:
                time.sleep(args.slow_last_round)
            hook.on_step_begin()
            for instr in order:
                hook.on_instruction_begin(
                    instr.kind, stage=instr.stage, microbatch=instr.microbatch
                )
                hook.on_instruction_end(instr.kind)
            hook.on_step_end()
    if args.rank == 0:
        print(
            "finish: " + (hook.finish_report.model_dump_json() if hook.finish_report else "null"),
            flush=True,
        )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
