"""One rank of a small 3D job (pp × dp × tp) that drives the Perseus hook by hand (the leader
tests).

``python tests/integration/client/leader_ranks.py --url URL --rank R --pp 2 --dp 2 --tp 1
--master-port P --trace-dir DIR``: rank R (``rank = (dp·pp + pp_rank)·tp + tp_rank``) of a
1F1B job on emulated GPUs in nominal mode, one round per step. ``--device-mesh`` gives the
hook a `DeviceMesh` (dp, pp, tp) besides the ranks. ``--odd-gpu R2``: rank R2's GPU is an
A40 (the others' A100s), which the in-job check must refuse. ``--slow`` makes this rank's
instructions that many times slower (a straggling replica). Prints ``error: ...`` and
exits 1 on a Perseus error.
"""

from __future__ import annotations

import argparse
import sys

import torch.distributed as dist

from perseus.client import EmulationSettings, PerseusOptimizer
from perseus.domain.schedule import make_schedule
from perseus.errors import PerseusError
from perseus.protocol import PipelineSpec
from zeus_power.device.emulated import EmulatedGPU

NOMINAL_S = {"forward": 0.003, "backward": 0.006}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--leaders-per-stage", type=int, default=1)
    p.add_argument("--master-port", type=int, required=True)
    p.add_argument("--microbatches", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--trace-dir", default=None)
    p.add_argument("--device-mesh", action="store_true")
    p.add_argument("--odd-gpu", type=int, default=None)
    p.add_argument("--slow", type=float, default=1.0)
    args = p.parse_args()
    world = args.pp * args.dp * args.tp
    tp_rank = args.rank % args.tp
    pp_rank = (args.rank // args.tp) % args.pp
    dp_rank = args.rank // (args.tp * args.pp)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{args.master_port}",
        rank=args.rank,
        world_size=world,
    )
    mesh = None
    if args.device_mesh:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(
            "cpu", (args.dp, args.pp, args.tp), mesh_dim_names=("dp", "pp", "tp")
        )
    schedule = make_schedule("1f1b", args.pp, args.microbatches)
    order = schedule.orders[pp_rank]
    gpu = EmulatedGPU(args.rank, gpu_type="A40" if args.rank == args.odd_gpu else "A100-SXM")
    nominal = {k: v * args.slow for k, v in NOMINAL_S.items()}
    try:
        with PerseusOptimizer(
            rank=args.rank,
            dp_rank=dp_rank,
            pp_rank=pp_rank,
            tp_rank=tp_rank,
            device_id=args.rank,
            dp_degree=args.dp,
            pp_degree=args.pp,
            tp_degree=args.tp,
            world_size=world,
            server_url=args.url,
            job_metadata="leaders",
            pipeline=PipelineSpec.of(schedule),
            gpu=gpu,
            emulation=EmulationSettings(nominal=True),
            nominal_time_s=nominal,
            timeout_s=10.0,
            trace_dir=args.trace_dir,
            leaders_per_stage=args.leaders_per_stage,
            device_mesh=mesh,
        ) as hook:
            for _ in range(args.steps):
                hook.on_step_begin()
                for instr in order:
                    hook.on_instruction_begin(
                        instr.kind, stage=instr.stage, microbatch=instr.microbatch
                    )
                    hook.on_instruction_end(instr.kind)
                hook.on_step_end()
    except PerseusError as exc:
        print(f"error: {type(exc).__name__}: {exc}", flush=True)
        sys.stdout.flush()
        import os

        os._exit(1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
