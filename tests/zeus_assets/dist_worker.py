"""A rank of a 2-process gloo job running GlobalPowerLimitOptimizer (test asset)."""

from __future__ import annotations

import json
from pathlib import Path

import torch.distributed as dist

from zeus_power.device.emulated import EmulatedGPU, VirtualClock, Workload
from zeus_power.monitor import ZeusMonitor
from zeus_power.power_limit import Energy, GlobalPowerLimitOptimizer


def rank_workload(rank: int) -> Workload:
    """Rank r does (1 + r) times the work of rank 0, so ranks differ in time and energy."""
    return Workload(compute_s_at_max=0.05 * (1 + rank), memory_s=0.01)


def run_rank(rank: int, world_size: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size
    )
    try:
        clock = VirtualClock()
        # Ideal sensors: the test compares the ranks' aggregate with the model's exact joules.
        gpu = EmulatedGPU(0, gpu_type="A40", clock=clock, sensors="ideal")
        monitor = ZeusMonitor(gpus=[gpu], time_fn=clock)
        opt = GlobalPowerLimitOptimizer(
            monitor,
            Energy(),
            warmup_steps=1,
            profile_steps=3,
            pl_step=100,
            profile_path=Path(out_dir) / "profile.json",
        )
        work = rank_workload(rank)
        for _ in range(20):
            opt.on_step_begin()
            gpu.execute(work)
        opt.on_epoch_end()
        (Path(out_dir) / f"rank{rank}.json").write_text(
            json.dumps([m.model_dump() for m in opt.measurements])
        )
    finally:
        dist.destroy_process_group()
