"""The in-job fan-out of a leader's round, timed on local processes (gloo) and extrapolated.

A leader folds its group's round in before it posts (`JobFanOut.gather`) and hands the
schedule out after (`JobFanOut.hand_out`); `fanout_timings` runs one level for real on a few
local processes, and `fit`, `gathered` and `tree_hops` extrapolate it with gloo's own
algorithms (see `bench_coordinator.py`'s docstring).
"""

from __future__ import annotations

import math
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from coordinator_clients import FREQS, result_body


def _fanout_rank(rank: int, world: int, store: str, microbatches: int, reps: int, out: Any) -> None:
    """One process of the local fan-out timing: `reps` folds and hand-outs of a real round."""
    import torch
    import torch.distributed as dist

    from perseus.client.wire.leaders import JobFanOut
    from perseus.protocol import FrequencySchedule, ParallelLayout, ProfilingResult

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    fanout = JobFanOut(
        dist,
        rank=rank,
        dp_rank=rank,
        pp_rank=0,
        tp_rank=0,
        layout=ParallelLayout(world, 1, 1),
        per_stage=1,
        steps_per_round=1,
        pipeline_key="bench",
        gpu_name="bench",
        frequencies=FREQS,
        emulated=True,
        switch_latency_s=None,
        timeout_s=120,
    )
    order = ["forward", "backward"] * microbatches
    result = ProfilingResult.model_validate(result_body(rank, [(k, 1410) for k in order], None))
    schedule = FrequencySchedule(rank=0, frequencies=[(k, 1005) for k in order])
    folds, handouts = [], []
    for rep in range(reps):
        dist.barrier()
        t0 = time.monotonic()
        fanout.gather(result)
        t1 = time.monotonic()
        if fanout.is_leader:
            fanout.hand_out(rep, schedule)
        else:
            fanout.receive(rep)
        t2 = time.monotonic()
        ends = [torch.zeros(2, dtype=torch.float64) for _ in range(world)]
        dist.all_gather(ends, torch.tensor([t1, t2], dtype=torch.float64))
        if rank == 0:
            folds.append(t1 - t0)
            handouts.append(max(float(e[1]) for e in ends) - t1)
    if rank == 0:
        out.put((statistics.median(folds[1:]), statistics.median(handouts[1:])))
    dist.destroy_process_group()


def fanout_timings(
    procs: list[int], microbatches: int, reps: int = 15
) -> dict[int, tuple[float, float]]:
    """Processes → (fold s, hand-out s), medians over `reps` rounds (the first dropped)."""
    ctx = multiprocessing.get_context("spawn")
    timings = {}
    for world in procs:
        out = ctx.Queue()
        with tempfile.TemporaryDirectory() as tmp:  # a file store: no port to race for
            store = str(Path(tmp) / "store")
            ps = [
                ctx.Process(target=_fanout_rank, args=(r, world, store, microbatches, reps, out))
                for r in range(world)
            ]
            for p in ps:
                p.start()
            timings[world] = out.get(timeout=600)
            for p in ps:
                p.join(timeout=60)
        print(
            f"  fan-out on {world} local processes: fold {1000 * timings[world][0]:.2f} ms, "
            f"hand-out {1000 * timings[world][1]:.2f} ms",
            file=sys.stderr,
        )
    return timings


def gathered(n: int) -> int:
    """Messages the root of a gloo gather over n ranks receives (one from every other)."""
    return n - 1


def tree_hops(n: int) -> int:
    """Sequential hops of gloo's binomial-tree broadcast over n ranks."""
    return math.ceil(math.log2(n)) if n > 1 else 0


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares (fixed s, s per step) of (steps, seconds), the slope at least 0."""
    xs, ys = [x for x, _ in points], [y for _, y in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = max(0.0, sum((x - mx) * (y - my) for x, y in points) / var) if var else 0.0
    return max(0.0, my - slope * mx), slope
