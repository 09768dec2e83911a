"""The hook on a real GPU, read only: its overhead per iteration, and instruction energy.

Needs a CUDA GPU, NVML and torch with CUDA; it never changes a clock or a power limit: the
hook drives the GPU through `ReadOnlyGPU`, which reads through NVML and drops every write
(it counts them), so the GPU runs at its own clocks. The coordinator is a real one on
loopback running `AllMaxFrequency`, and the hook does a full round every
``--steps-per-round`` iterations.

The workload is one pipeline stage of a GPT-style transformer (``--layers`` pre-norm
blocks of ``perseus.train.model.Block``), bf16 autocast, run as a one-stage 1F1B iteration
(F0 B0 F1 B1 …) on activations already on the GPU, then an SGD step: nothing in the loop
synchronises the host but the end of the iteration. Variants, interleaved block by block:

- ``bare``: no hook;
- ``sync-only``: a device synchronisation before and after every instruction, nothing else;
- ``hook-sync``: `PerseusOptimizer` with ``timing="sync"`` (today's default);
- ``hook-events``: `PerseusOptimizer` with ``timing="events"`` (CUDA events and a watcher
  thread, one synchronisation per iteration).

Then the instruction energy, three ways, over the same instructions (synchronised around
each): the GPU's energy counter, and NVML power samples (``nvmlDeviceGetPowerUsage`` and
the instantaneous ``NVML_FI_DEV_POWER_INSTANT`` field) integrated over the instruction,
with how often each reading actually changes.

    python benchmarks/bench_hook_gpu.py --out DIR [--iters 40] [--layers 4] [--hidden 2048]
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from hook_gpu_probes import (  # this script's folder is on sys.path
    NullHook,
    Probe,
    ReadOnlyGPU,
    Sampler,
    SyncOnly,
    change_period_ms,
    integrate,
    summarize,
)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="Write results.json and traces here")
    p.add_argument("--iters", type=int, default=40, help="Timed iterations per variant")
    p.add_argument("--block", type=int, default=2, help="Iterations per variant per block")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--microbatch-size", type=int, default=4)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--steps-per-round", type=int, default=1)
    p.add_argument("--energy-iters", type=int, default=20, help="Iterations of the energy probe")
    p.add_argument("--sample-period-ms", type=float, default=1.0)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    import pynvml
    import torch
    import torch.distributed as dist

    from perseus.client import PerseusOptimizer
    from perseus.demo import Coordinator, free_port
    from perseus.protocol import ParallelLayout, PipelineSpec
    from perseus.train.model import Block, GPTConfig
    from zeus_power.device.nvml import open_nvml_gpus

    if not torch.cuda.is_available():
        raise SystemExit("bench_hook_gpu needs a CUDA GPU")
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = torch.device("cuda", 0)
    nvml_gpu = open_nvml_gpus([0])[0]
    gpu = ReadOnlyGPU(nvml_gpu)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    before = {
        "name": nvml_gpu.name() if callable(nvml_gpu.name) else nvml_gpu.name,
        "power_limit_mw": nvml_gpu.get_power_limit_mw(),
        "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
    }

    config = GPTConfig(
        hidden=args.hidden,
        heads=args.heads,
        seq_len=args.seq_len,
        microbatch_size=args.microbatch_size,
    )
    torch.manual_seed(0)
    stage = torch.nn.Sequential(*(Block(config) for _ in range(args.layers))).to(dev)
    opt = torch.optim.SGD(stage.parameters(), lr=1e-6, foreach=True)
    M = args.microbatches
    shape = (args.microbatch_size, args.seq_len, args.hidden)
    xs = [torch.randn(shape, device=dev, requires_grad=True) for _ in range(M)]
    gs = [torch.randn(shape, device=dev, dtype=torch.bfloat16) for _ in range(M)]
    names = [kind for _ in range(M) for kind in ("forward", "backward")]

    def step(hook: Any) -> float:
        start = time.perf_counter()
        hook.on_step_begin()
        for j in range(M):
            hook.on_instruction_begin("forward", stage=0, microbatch=j)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = stage(xs[j])
            hook.on_instruction_end("forward")
            hook.on_instruction_begin("backward", stage=0, microbatch=j)
            out.backward(gs[j])
            hook.on_instruction_end("backward")
        opt.step()
        opt.zero_grad(set_to_none=True)
        for x in xs:
            x.grad = None
        hook.on_step_end()
        torch.cuda.synchronize(dev)
        return time.perf_counter() - start

    sync = lambda: torch.cuda.synchronize(dev)  # noqa: E731
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    order = [(0, kind, j) for j in range(M) for kind in ("forward", "backward")]
    pipeline = PipelineSpec(schedule="1f1b", num_stages=1, num_microbatches=M, orders=[order])
    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "gpu": before}
    with (
        tempfile.TemporaryDirectory() as tmp,
        Coordinator(
            scheduler="AllMaxFrequency",
            scheduler_args={"num_microbatches": M},
            dump_dir=Path(tmp) / "dump",
            log_path=args.out / "coordinator.log",
        ) as coordinator,
    ):

        def hook(timing: str) -> PerseusOptimizer:
            return PerseusOptimizer.from_layout(
                ParallelLayout(dp_degree=1, pp_degree=1, tp_degree=1),
                rank=0,
                device_id=0,
                server_url=coordinator.url,
                steps_per_round=args.steps_per_round,
                gpu=gpu,  # type: ignore[arg-type]
                expected_instructions=names,
                pipeline=pipeline,
                timing=timing,
                trace_dir=args.out / f"trace-{timing}",
            )

        variants: dict[str, Any] = {
            "bare": NullHook(),
            "sync-only": SyncOnly(sync),
            "hook-sync": hook("sync"),
            "hook-events": hook("events"),
        }
        for h in variants.values():  # warm-up (and each hook's first round)
            for _ in range(args.warmup):
                step(h)
        times: dict[str, list[float]] = {name: [] for name in variants}
        rotation = list(variants)
        while len(times["bare"]) < args.iters:
            for name in rotation:
                for _ in range(args.block):
                    times[name].append(step(variants[name]))
            rotation = rotation[1:] + rotation[:1]
        for name in ("hook-sync", "hook-events"):
            variants[name].close()
        results["iteration_s"] = {name: summarize(v) for name, v in times.items()}
        bare = results["iteration_s"]["bare"]["median"]
        results["overhead_pct"] = {
            name: 100.0 * (s["median"] / bare - 1.0) for name, s in results["iteration_s"].items()
        }
        results["gpu_writes_dropped"] = dict(gpu.writes)

    # Per kind, the time each hook measured (from its trace), after the warm-up rounds. (No
    # energy per instruction: no GPU shows one; the coordinator estimates it from the
    # counter's refreshes.)
    per_kind: dict[str, dict[str, dict[str, float]]] = {}
    for timing in ("sync", "events"):
        acc: dict[str, list[float]] = collections.defaultdict(list)
        for line in (args.out / f"trace-{timing}" / "rank0.jsonl").read_text().splitlines():
            rec = json.loads(line)
            if rec.get("kind") == "instruction" and rec["step"] >= args.warmup:
                acc[rec["instruction"]].append(rec["time_s"])
        per_kind[timing] = {
            kind: {"time_ms": 1000 * statistics.mean(v), "n": len(v)} for kind, v in acc.items()
        }
    results["hook_per_kind"] = per_kind

    # Energy: counter vs power sampling, over the same synchronised instruction windows.
    probe = Probe(sync, nvml_gpu.total_energy_mj)
    for _ in range(3):
        step(NullHook())
    with Sampler(handle, args.sample_period_ms / 1000.0) as sampler:
        time.sleep(0.2)
        for _ in range(args.energy_iters):
            step(probe)
        time.sleep(0.2)
    avg = [(t, a) for t, a, _, _ in sampler.samples]
    inst = [(t, i) for t, _, i, _ in sampler.samples if i is not None]
    ctr = [(t, c) for t, _, _, c in sampler.samples]
    energy: dict[str, dict[str, float | None]] = {}
    for kind in ("forward", "backward"):
        rows = [w for w in probe.windows if w[0] == kind]
        counter = [(e1 - e0) / 1000.0 for _, _, _, e0, e1 in rows]
        by_avg = [integrate(avg, t0, t1) for _, t0, t1, _, _ in rows]
        by_inst = [integrate(inst, t0, t1) for _, t0, t1, _, _ in rows] if inst else []
        dur = [t1 - t0 for _, t0, t1, _, _ in rows]
        energy[kind] = {
            "n": len(rows),
            "time_ms": 1000 * statistics.mean(dur),
            "counter_j": statistics.mean(counter),
            "counter_cv": statistics.pstdev(counter) / statistics.mean(counter),
            "power_usage_j": statistics.mean(e for e in by_avg if e is not None),
            "power_instant_j": (
                statistics.mean(e for e in by_inst if e is not None) if inst else None
            ),
        }
    t_first, t_last = probe.windows[0][1], probe.windows[-1][2]
    total_ctr = (ctr[-1][1] - ctr[0][1]) / 1000.0
    results["energy"] = {
        "per_kind": energy,
        "whole_probe": {
            "seconds": t_last - t_first,
            "counter_j": sum((e1 - e0) for *_, e0, e1 in probe.windows) / 1000.0,
            "power_usage_j": sum(
                integrate(avg, t0, t1) or 0.0 for _, t0, t1, _, _ in probe.windows
            ),
            "power_instant_j": (
                sum(integrate(inst, t0, t1) or 0.0 for _, t0, t1, _, _ in probe.windows)
                if inst
                else None
            ),
            "sampled_counter_total_j": total_ctr,
        },
        "samples": len(sampler.samples),
        "sample_period_ms": (sampler.samples[-1][0] - sampler.samples[0][0])
        / max(1, len(sampler.samples) - 1)
        * 1000.0,
        "change_period_ms": {
            "energy_counter": change_period_ms(ctr),
            "power_usage": change_period_ms(avg),
            "power_instant": change_period_ms(inst) if inst else None,
        },
    }
    span = (sampler.samples[0][0], sampler.samples[-1][0])
    results["energy"]["whole_span"] = {
        "seconds": span[1] - span[0],
        "counter_j": total_ctr,
        "power_usage_j": integrate(avg, *span),
        "power_instant_j": integrate(inst, *span) if inst else None,
    }
    # What one NVML read costs (the hook's sync timing makes two per instruction).
    latency: dict[str, float] = {}
    for what, read in (
        ("total_energy", lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)),
        ("power_usage", lambda: pynvml.nvmlDeviceGetPowerUsage(handle)),
        ("clock_sm", lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
    ):
        took = []
        for _ in range(100):
            t0 = time.perf_counter()
            read()
            took.append(time.perf_counter() - t0)
        latency[what] = 1e6 * statistics.median(took)
    results["nvml_read_us"] = latency
    results["gpu_after"] = {
        "power_limit_mw": nvml_gpu.get_power_limit_mw(),
        "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
    }
    (args.out / "results.json").write_text(json.dumps(results, indent=2, default=str))

    print(
        f"GPU {before['name']}, power limit {before['power_limit_mw'] / 1000:.0f} W "
        f"(after: {results['gpu_after']['power_limit_mw'] / 1000:.0f} W); clock writes "
        f"dropped: {dict(gpu.writes)}"
    )
    print(
        f"stage: {args.layers} layers, hidden {args.hidden}, {M} microbatches of "
        f"{args.microbatch_size}x{args.seq_len}; {args.iters} iterations per variant"
    )
    print(f"{'variant':<12} {'median ms':>10} {'p10':>8} {'p90':>8} {'overhead':>9}")
    for name, s in results["iteration_s"].items():
        print(
            f"{name:<12} {1000 * s['median']:>10.2f} {1000 * s['p10']:>8.2f} "
            f"{1000 * s['p90']:>8.2f} {results['overhead_pct'][name]:>+8.2f}%"
        )
    for timing, kinds in per_kind.items():
        for kind, v in sorted(kinds.items()):
            print(f"hook-{timing:<7} {kind:<9} {v['time_ms']:8.3f} ms (n={v['n']})")
    for kind, v in energy.items():
        print(
            f"energy {kind:<9} {v['time_ms']:7.3f} ms: counter {v['counter_j']:.3f} J "
            f"(cv {v['counter_cv']:.2f}), power usage {v['power_usage_j']:.3f} J, "
            f"instant {v['power_instant_j']}"
        )
    print("whole probe:", json.dumps(results["energy"]["whole_probe"]))
    print("whole span:", json.dumps(results["energy"]["whole_span"]))
    print("NVML read, median us:", json.dumps(latency))
    print(
        "reading change periods (ms):",
        json.dumps(results["energy"]["change_period_ms"]),
        f"sampled every {results['energy']['sample_period_ms']:.2f} ms",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
