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
import json
import sys
from pathlib import Path
from typing import Any

from nvml_reads import (  # this script's folder is on sys.path
    FAILURES,
    blocked_power,
    check,
    compare_spec,
    idle_power,
    measure,
    monitor_windows,
    read_device,
    spec_for,
)

from perseus.io.profile_csv import load_profile
from zeus_power.device import (
    DVFSModel,
    GPUSpec,
    Workload,
    open_gpus,
)


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
