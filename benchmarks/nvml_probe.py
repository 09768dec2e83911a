"""Check the NVML backend on a real GPU, read-only, and record a real instruction profile.

Every read path of `zeus_power.device`'s NVML backend runs against the real driver: name,
supported memory and SM clocks, power-limit constraints, default and current power limit,
the energy counter, power usage, and one error translation (an invalid memory clock must
come back as a `GPUError`, not a raw `NVMLError`). The numbers are compared with the
emulator's spec for the same product.

Then the project's own GPT-like stages (`perseus.train.model`) run forward and backward on
the GPU, and each instruction's time and energy are measured with the energy counter:
a real instruction profile, in the short CSV form `perseus solve` reads. It is recorded at
the clocks the GPU runs as found, one frequency per instruction: this script never locks
clocks or sets a power limit, because it is meant to run on GPUs shared with others. (A
frequency sweep needs `lock_sm_clocks`, which the online profiler in the client hook does
on a GPU you own.) The measured busy power is turned into the emulator's activity factor
at the observed clock; idle power and the power of a spinning kernel (a stand-in for
NCCL's receive kernel blocked on P2P) are compared with the spec's; `ZeusMonitor` windows,
by energy counter and by forced power polling, are checked against direct counter reads.

    python benchmarks/nvml_probe.py --out probe/ [--gpu 0] [--seconds 2] [--layers 3,4,4,2]

Writes ``probe.json`` (every reading) and ``real_profile.csv``; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from perseus.io.profile_csv import load_profile
from zeus_power.device import (
    GPU_SPECS,
    DVFSModel,
    GPUError,
    GPUSpec,
    GPUValueError,
    Workload,
    open_gpus,
)

FAILURES: list[str] = []


def check(ok: bool, what: str) -> None:
    print(f"  [{'ok' if ok else 'FAIL'}] {what}")
    if not ok:
        FAILURES.append(what)


def spec_for(name: str) -> GPUSpec | None:
    return next((s for s in GPU_SPECS.values() if s.product_name == name), None)


class Sampler:
    """Samples power usage, the energy counter and the SM clock in a thread (every 20 ms)."""

    def __init__(self, gpu: Any) -> None:
        import pynvml

        self.gpu = gpu
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(gpu.nvml_index)
        self.power_w: list[float] = []
        self.energy_mj: list[int] = []
        self.sm_mhz: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import pynvml

        while not self._stop.is_set():
            self.power_w.append(self.gpu.power_usage_mw() / 1000)
            self.energy_mj.append(self.gpu.total_energy_mj())
            self.sm_mhz.append(pynvml.nvmlDeviceGetClockInfo(self._handle, pynvml.NVML_CLOCK_SM))
            time.sleep(0.02)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def read_device(gpu: Any) -> dict[str, Any]:
    print("== device reads (zeus_power.device, NVML backend)")
    r: dict[str, Any] = {"name": gpu.name()}
    r["memory_clocks_mhz"] = gpu.supported_memory_clocks_mhz()
    r["sm_clocks_mhz"] = gpu.supported_sm_clocks_mhz()
    r["power_limit_constraints_mw"] = list(gpu.power_limit_constraints_mw())
    r["default_power_limit_mw"] = gpu.default_power_limit_mw()
    r["power_limit_mw"] = gpu.get_power_limit_mw()
    r["supports_energy_counter"] = gpu.supports_energy_counter()
    sm = r["sm_clocks_mhz"]
    steps = Counter(a - b for a, b in itertools.pairwise(sm))
    r["sm_clock_steps_mhz"] = {str(k): v for k, v in steps.most_common()}
    low, high = r["power_limit_constraints_mw"]
    print(f"  name: {r['name']}")
    print(f"  memory clocks: {r['memory_clocks_mhz']}")
    print(f"  SM clocks: {len(sm)} from {sm[0]} to {sm[-1]} MHz, steps {dict(steps)}")
    print(
        f"  power limit: {r['power_limit_mw']} mW (default {r['default_power_limit_mw']}, "
        f"range {low}..{high})"
    )
    check(sm == sorted(set(sm), reverse=True) and len(sm) > 1, "SM clocks descending, unique")
    check(low <= r["power_limit_mw"] <= high, "current power limit within its constraints")
    check(r["supports_energy_counter"], "energy counter supported")
    r["sm_clocks_by_memory_clock"] = {}
    for mem in r["memory_clocks_mhz"]:
        clocks = gpu.supported_sm_clocks_mhz(memory_clock_mhz=mem)
        r["sm_clocks_by_memory_clock"][str(mem)] = clocks
        print(f"  memory {mem} MHz: {len(clocks)} SM clocks, {clocks[0]}..{clocks[-1]} MHz")
    try:
        gpu.supported_sm_clocks_mhz(memory_clock_mhz=1)
    except GPUError as exc:
        r["invalid_memory_clock_error"] = f"{type(exc).__name__}: {exc}"
        # The emulator answers the same question with GPUValueError; both backends must agree.
        check(isinstance(exc, GPUValueError), f"invalid memory clock -> {type(exc).__name__}")
    except Exception as exc:
        check(False, f"invalid memory clock leaked {type(exc).__name__}: {exc}")
    else:
        check(False, "invalid memory clock raised nothing")
    return r


def compare_spec(reads: dict[str, Any], spec: GPUSpec | None) -> dict[str, Any]:
    print("== against the emulator's spec")
    if spec is None:
        print(f"  no emulated spec has product name {reads['name']!r}")
        return {}
    sm = reads["sm_clocks_mhz"]
    emulated = spec.supported_sm_clocks_mhz()
    low, high = reads["power_limit_constraints_mw"]
    rows = {
        "max SM clock (MHz)": (sm[0], spec.max_sm_clock_mhz),
        "min SM clock (MHz)": (sm[-1], spec.min_sm_clock_mhz),
        "SM clock count": (len(sm), len(emulated)),
        "SM clocks shared": (len(set(sm) & set(emulated)), len(emulated)),
        "memory clocks (MHz)": (reads["memory_clocks_mhz"], list(spec.memory_clocks_mhz)),
        "power limit min (W)": (low / 1000, spec.min_power_limit_w),
        "power limit max (W)": (high / 1000, spec.max_power_limit_w),
        "default power limit (W)": (
            reads["default_power_limit_mw"] / 1000,
            spec.default_power_limit_w,
        ),
    }
    for what, (real, emu) in rows.items():
        print(f"  {what:26s} real {real!s:>14}   emulated ({spec.gpu_type}) {emu!s:>14}")
    return {what: {"real": real, "emulated": emu} for what, (real, emu) in rows.items()}


def idle_power(gpu: Any, seconds: float) -> dict[str, Any]:
    print(f"== idle, {seconds:.0f} s")
    t0, e0 = time.perf_counter(), gpu.total_energy_mj()
    with Sampler(gpu) as s:
        time.sleep(seconds)
    t1, e1 = time.perf_counter(), gpu.total_energy_mj()
    counter_w = (e1 - e0) / 1000 / (t1 - t0)
    sampled_w = statistics.fmean(s.power_w)
    monotone = all(b >= a for a, b in zip(s.energy_mj, s.energy_mj[1:], strict=False))
    distinct = len(set(s.energy_mj))
    print(
        f"  energy counter: {counter_w:.1f} W; power usage samples: {sampled_w:.1f} W; "
        f"SM clock median {statistics.median(s.sm_mhz)} MHz; "
        f"{distinct} distinct counter values in {len(s.energy_mj)} reads"
    )
    check(monotone, "energy counter never decreases")
    check(abs(counter_w - sampled_w) <= 0.15 * sampled_w + 5, "counter and sampled power agree")
    return {
        "counter_w": counter_w,
        "sampled_w": sampled_w,
        "sm_mhz": statistics.median(s.sm_mhz),
        "reads": len(s.energy_mj),
        "distinct_counter_values": distinct,
    }


def blocked_power(gpu: Any, seconds: float) -> dict[str, float]:
    """Power while a kernel spins, as NCCL's receive kernels do while blocked on P2P."""
    import torch

    torch.cuda.init()
    m = measure(gpu, lambda: torch.cuda._sleep(2_000_000), seconds)
    print(
        f"== spin kernel (torch.cuda._sleep), a stand-in for blocking on P2P: "
        f"{m['counter_w']:.1f} W at SM {m['sm_mhz']:.0f} MHz"
    )
    return m


def monitor_windows(gpu: Any, step: Any, seconds: float) -> dict[str, float]:
    """`ZeusMonitor` windows on the real GPU: energy counter, and power polling forced."""
    import torch

    from zeus_power.device.nvml import NVMLGPU
    from zeus_power.monitor import ZeusMonitor

    class PolledGPU(NVMLGPU):
        def supports_energy_counter(self) -> bool:
            return False

    counter = ZeusMonitor(gpus=[gpu])
    polled = ZeusMonitor(gpus=[PolledGPU(gpu.index, nvml_index=gpu.nvml_index)])
    reps = measure(gpu, step, seconds)["reps"]  # also brings the GPU to a steady power
    e0 = gpu.total_energy_mj()
    counter.begin_window("probe")
    polled.begin_window("probe")
    for _ in range(int(reps)):
        step()
    torch.cuda.synchronize()
    by_counter = counter.end_window("probe")
    by_polling = polled.end_window("probe")
    direct_j = (gpu.total_energy_mj() - e0) / 1000
    polled.close()
    r = {
        "time_s": by_counter.time_s,
        "direct_counter_j": direct_j,
        "monitor_counter_j": by_counter.total_energy_j,
        "monitor_polling_j": by_polling.total_energy_j,
    }
    print(
        f"== ZeusMonitor window, {r['time_s']:.1f} s of stage work: energy counter "
        f"{r['monitor_counter_j']:.1f} J, power polling {r['monitor_polling_j']:.1f} J, "
        f"direct counter reads {direct_j:.1f} J"
    )
    check(
        abs(r["monitor_counter_j"] - direct_j) <= 0.01 * direct_j, "monitor window = counter delta"
    )
    check(
        abs(r["monitor_polling_j"] - direct_j) <= 0.10 * direct_j,
        "power-polling window within 10 % of the counter (steady load)",
    )
    return r


def measure(gpu: Any, step: Any, seconds: float) -> dict[str, float]:
    """Run `step` repeatedly for about `seconds`; time, energy and power per call."""
    import torch

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    step()
    torch.cuda.synchronize()
    reps = max(5, math.ceil(seconds / max(time.perf_counter() - t, 1e-6)))
    with Sampler(gpu) as s:
        t0, e0 = time.perf_counter(), gpu.total_energy_mj()
        for _ in range(reps):
            step()
        torch.cuda.synchronize()
        t1, e1 = time.perf_counter(), gpu.total_energy_mj()
    elapsed, energy = t1 - t0, (e1 - e0) / 1000
    return {
        "reps": reps,
        "time_s": elapsed / reps,
        "energy_j": energy / reps,
        "counter_w": energy / elapsed,
        "sampled_w": statistics.fmean(s.power_w) if s.power_w else float("nan"),
        "sm_mhz": statistics.median(s.sm_mhz) if s.sm_mhz else float("nan"),
    }


def profile_stages(
    gpu: Any, args: argparse.Namespace, result: dict[str, Any]
) -> list[dict[str, Any]]:
    """Measure every stage's forward and backward; also checks `ZeusMonitor` on stage 1."""
    import torch

    from perseus.train.model import GPTConfig, StageModule, parse_layers

    layers = parse_layers(args.layers)
    config = GPTConfig(
        vocab_size=args.vocab,
        hidden=args.hidden,
        heads=args.heads,
        seq_len=args.seq_len,
        microbatch_size=args.microbatch,
    )
    device = torch.device("cuda", gpu.index)
    torch.backends.cuda.matmul.allow_tf32 = True
    print(
        f"== instruction profile: {len(layers)} stages, layers {layers}, hidden {args.hidden}, "
        f"seq {args.seq_len}, microbatch {args.microbatch}, bf16 autocast, "
        f"~{args.seconds:.1f} s per instruction"
    )
    rows = []
    for stage in range(len(layers)):
        model = StageModule(config, layers, stage, seed=0).to(device)
        shape = config.activation_shape
        if model.first:
            x = torch.randint(0, config.vocab_size, shape[:2], device=device)
        else:
            x = torch.randn(shape, device=device, requires_grad=True)
        targets = torch.randint(0, config.vocab_size, shape[:2], device=device)

        def forward(model: Any = model, x: Any = x, targets: Any = targets) -> Any:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = model(x)
                return model.loss(y, targets) if model.last else y

        out = forward()
        grad = None if model.last else torch.randn_like(out)

        def backward(out: Any = out, grad: Any = grad) -> None:
            out.backward(grad, retain_graph=True)

        if stage == 1:
            result["monitor"] = monitor_windows(gpu, backward, 2 * args.seconds)
        for instruction, step in (("forward", forward), ("backward", backward)):
            m = measure(gpu, step, args.seconds)
            m.update(stage=stage, instruction=instruction)
            rows.append(m)
            print(
                f"  stage {stage} {instruction:8s} {m['time_s'] * 1e3:8.2f} ms "
                f"{m['energy_j']:8.3f} J  {m['counter_w']:6.1f} W (sampled "
                f"{m['sampled_w']:6.1f} W)  SM {m['sm_mhz']:.0f} MHz  x{m['reps']}"
            )
            check(m["energy_j"] > 0 and m["time_s"] > 0, f"stage {stage} {instruction} measured")
        del model, x, out, grad
        torch.cuda.empty_cache()
    return rows


def write_profile(rows: list[dict[str, Any]], path: Path, microbatches: int) -> dict[str, Any]:
    from perseus.domain.schedule import make_schedule
    from perseus.planning import evaluate, max_frequencies

    lines = ["stage,instruction,frequency,time,energy"]
    lines += [
        f"{r['stage']},{r['instruction']},{int(r['sm_mhz'])},{r['time_s']:.9f},{r['energy_j']:.9f}"
        for r in rows
    ]
    path.write_text("\n".join(lines) + "\n")
    profile = load_profile(path)
    schedule = make_schedule("1f1b", profile.num_stages, microbatches)
    p2p_w = 0.0
    ev = evaluate(profile, schedule, max_frequencies(profile, schedule), p2p_w)
    print(
        f"== {path.name}: read back by InstructionProfile; 1F1B {profile.num_stages}x"
        f"{microbatches} as measured: T = {ev.iteration_time_s * 1e3:.1f} ms, "
        f"computation energy = {ev.energy_j:.1f} J"
    )
    return {"iteration_time_s": ev.iteration_time_s, "computation_energy_j": ev.energy_j}


def fit_activity(rows: list[dict[str, Any]], spec: GPUSpec | None) -> list[dict[str, Any]]:
    """The emulator activity that reproduces each measured busy power at its observed clock."""
    if spec is None:
        return []
    print(
        f"== emulator activity at the observed clock ({spec.gpu_type}: static "
        f"{spec.static_power_w} W + activity x {spec.dynamic_power_w} W x V(f)^2 f/fmax)"
    )
    model = DVFSModel(spec)
    full = Workload(compute_s_at_max=1.0, activity=1.0)
    fits = []
    for r in rows:
        f = min(max(r["sm_mhz"], spec.min_sm_clock_mhz), spec.max_sm_clock_mhz)
        # Busy power is linear in activity: static + activity · (power at activity 1 − static).
        dynamic_at_f = model.power_w(full, f) - spec.static_power_w
        activity = (r["counter_w"] - spec.static_power_w) / dynamic_at_f
        fits.append({"stage": r["stage"], "instruction": r["instruction"], "activity": activity})
        print(
            f"  stage {r['stage']} {r['instruction']:8s} {r['counter_w']:6.1f} W at {f:.0f} MHz"
            f" -> activity {activity:.2f}"
        )
    return fits


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    parser.add_argument("--layers", default="3,4,4,2")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--microbatch", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--microbatches", type=int, default=8)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    (gpu,) = open_gpus([args.gpu], backend="nvml")
    reads = read_device(gpu)
    spec = spec_for(reads["name"])
    result: dict[str, Any] = {"device": reads, "spec": compare_spec(reads, spec)}
    result["idle"] = idle_power(gpu, args.idle_seconds)
    if spec is not None:
        print(f"  emulator idle power ({spec.gpu_type}): {spec.idle_power_w} W")
    result["blocked"] = blocked_power(gpu, args.seconds)
    if spec is not None:
        print(f"  emulator P2P-blocking power ({spec.gpu_type}): {spec.p2p_block_power_w} W")
    result["instructions"] = profile_stages(gpu, args, result)
    result["pipeline"] = write_profile(
        result["instructions"], args.out / "real_profile.csv", args.microbatches
    )
    result["activity_fit"] = fit_activity(result["instructions"], spec)
    result["power_limit_after_mw"] = gpu.get_power_limit_mw()
    check(result["power_limit_after_mw"] == reads["power_limit_mw"], "power limit left as found")
    result["failures"] = FAILURES
    (args.out / "probe.json").write_text(json.dumps(result, indent=2, default=str))
    print(f"== {len(FAILURES)} check(s) failed" if FAILURES else "== all checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
