"""Overhead of the Perseus per-rank hook on a training iteration (target: <= 1 %).

Runs the real 1F1B training loop (`perseus.train`, one stage, in this process, a one-rank
gloo group) with and without `PerseusOptimizer`. The overhead is the time the training
thread spends inside the hook's calls, per iteration, over the unhooked iteration time;
an A/B wall-clock comparison (interleaved iterations) is printed beside it, but on a
shared CPU its noise is larger than the effect. The hook runs on an `EmulatedGPU` with
stretching off (``PERSEUS_EMULATE_STRETCH=0``): it measures every instruction (device sync,
energy counter), hands every clock to its background thread and, with the default
``--steps-per-round 1``, does a full coordinator round (``GET /schedule`` barrier + ``POST
/result``) every iteration against a real `AllMaxFrequency` coordinator on loopback: the
worst case. Also reports the cost of one on_instruction_begin/end pair on its own.

    python benchmarks/bench_hook.py [--iters 40] [--layers 4] [--microbatches 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path


class _TimedHook:
    """Forwards to the hook, timing every call: the hook's in-band time on the training thread.

    `round_s`: per iteration, on_step_begin + on_step_end (where the coordinator round
    happens); `inband_s`: per iteration, every hook call.
    """

    def __init__(self, hook: object) -> None:
        self.hook = hook
        self.round_s: list[float] = []
        self.inband_s: list[float] = []
        self._round = 0.0
        self._inband = 0.0

    def _timed(self, name: str, *args: str, **kwargs: int | None) -> float:
        t0 = time.perf_counter()
        getattr(self.hook, name)(*args, **kwargs)
        took = time.perf_counter() - t0
        self._inband += took
        return took

    def on_step_begin(self) -> None:
        self._round = self._inband = 0.0
        self._round += self._timed("on_step_begin")

    def on_step_end(self) -> None:
        self._round += self._timed("on_step_end")
        self.round_s.append(self._round)
        self.inband_s.append(self._inband)

    def on_instruction_begin(self, name: str, **where: int | None) -> None:
        self._timed("on_instruction_begin", name, **where)  # where: stage, microbatch

    def on_instruction_end(self, name: str, **where: int | None) -> None:
        self._timed("on_instruction_end", name, **where)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--iters", type=int, default=60, help="Iterations per variant")
    p.add_argument("--block", type=int, default=1, help="Iterations per block (A/B interleaving)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--microbatch-size", type=int, default=4)
    p.add_argument("--steps-per-round", type=int, default=1)
    p.add_argument("--json", type=Path, default=None, help="Also write the results here")
    args = p.parse_args()

    import torch
    import torch.distributed as dist

    from perseus.client import EmulationSettings, PerseusOptimizer
    from perseus.demo import Coordinator, free_port
    from perseus.protocol import ParallelLayout
    from perseus.train.layout import Topology
    from perseus.train.manual import NullHook, PipelineTrainer
    from perseus.train.model import GPTConfig
    from zeus_power.device.emulated import EmulatedGPU

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    config = GPTConfig(
        hidden=args.hidden, seq_len=args.seq_len, microbatch_size=args.microbatch_size
    )
    trainer = PipelineTrainer(
        config, [args.layers], Topology(rank=0, world_size=1, pp_degree=1), args.microbatches
    )
    null = NullHook()
    for step in range(3):  # warm-up
        trainer.train_step(-1 - step, null)

    with (
        tempfile.TemporaryDirectory() as tmp,
        Coordinator(
            scheduler="AllMaxFrequency",
            scheduler_args={"num_microbatches": args.microbatches},
            dump_dir=Path(tmp) / "dump",
            log_path=Path(tmp) / "coordinator.log",
        ) as coordinator,
    ):
        gpu = EmulatedGPU(0)
        hook = PerseusOptimizer.from_layout(
            ParallelLayout(dp_degree=1, pp_degree=1, tp_degree=1),
            rank=0,
            device_id=0,
            server_url=coordinator.url,
            steps_per_round=args.steps_per_round,
            gpu=gpu,
            emulation=EmulationSettings(stretch=False),
            expected_instructions=trainer.instruction_names,
        )
        timed = _TimedHook(hook)
        times: dict[str, list[float]] = {"without": [], "with": []}
        step = 0
        with hook:
            # The hook's first round registers and warms the HTTP connection.
            trainer.train_step(step, hook)
            step += 1
            while len(times["with"]) < args.iters:
                for name, h in (("without", null), ("with", timed)):
                    for _ in range(args.block):
                        start = time.perf_counter()
                        trainer.train_step(step, h)
                        times[name].append(time.perf_counter() - start)
                        step += 1
            # The per-instruction cost alone (no compute between begin and end). A dedicated
            # schedule of one long iteration is not available, so time pairs inside steps.
            pair_s = []
            for _ in range(5):
                hook.on_step_begin()
                for name in trainer.instruction_names:
                    t0 = time.perf_counter()
                    hook.on_instruction_begin(name)
                    hook.on_instruction_end(name)
                    pair_s.append(time.perf_counter() - t0)
                hook.on_step_end()
    dist.destroy_process_group()

    without = statistics.median(times["without"])
    with_hook = statistics.median(times["with"])
    # Paired estimate: each hooked iteration against the unhooked one just before it, so a
    # burst of load on a shared machine cancels out instead of landing on one variant.
    diffs = [w - o for w, o in zip(times["with"], times["without"], strict=True)]
    ab_overhead = statistics.median(diffs) / without
    inband = statistics.mean(timed.inband_s)
    overhead = inband / without
    n_instr = len(trainer.instruction_names)
    result = {
        "iterations_per_variant": len(times["with"]),
        "instructions_per_iteration": n_instr,
        "steps_per_round": args.steps_per_round,
        "iteration_s_without_hook": without,
        "iteration_s_with_hook": with_hook,
        "overhead_fraction": overhead,
        "hook_inband_ms_mean": 1e3 * inband,
        "round_ms_mean": 1e3 * statistics.mean(timed.round_s),
        "ab_overhead_fraction_paired": ab_overhead,
        "ab_overhead_fraction_of_medians": with_hook / without - 1,
        "instruction_pair_us_median": 1e6 * statistics.median(pair_s),
        "instruction_pair_us_p90": 1e6 * sorted(pair_s)[int(0.9 * len(pair_s))],
    }
    print(f"iteration without hook: {1e3 * without:8.2f} ms (median of {len(times['without'])})")
    print(
        f"hook time per iteration:{1e3 * inband:8.2f} ms = {100 * overhead:.2f} % of an iteration "
        f"({n_instr} instructions; the coordinator round, every {args.steps_per_round} "
        f"iteration(s), {result['round_ms_mean']:.2f} ms of it on average)"
    )
    print(
        f"begin+end pair alone:   {result['instruction_pair_us_median']:8.1f} us median, "
        f"{result['instruction_pair_us_p90']:.1f} us p90"
    )
    print(
        f"A/B wall clock:         with hook {1e3 * with_hook:.2f} ms: {100 * ab_overhead:+.2f} % "
        f"paired, {100 * (with_hook / without - 1):+.2f} % of medians (noisy on a shared CPU)"
    )
    print("target (hook time <= 1 % of an iteration):", "met" if overhead <= 0.01 else "NOT met")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
