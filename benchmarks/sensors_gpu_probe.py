"""On a real GPU, read only: per-kind energy from energy windows against each kind run alone.

Usage (a CUDA GPU, NVML and torch with CUDA; never sets a clock or a power limit)::

    python benchmarks/sensors_gpu_probe.py --out DIR [--seconds 30] [--alone-s 6] [--max-s 240]
    python benchmarks/sensors_gpu_probe.py --out DIR --emulated   # the same on an emulated H100

Two kernel mixes of clearly different power run at the GPU's own clock: ``heavy`` (bf16
matrix products, compute-bound) and ``light`` (an fp32 multiply-add streamed through a
large tensor, memory-bound), each an "instruction" of about 8 ms. Phases:

1. each mix alone, back to back, ``--alone-s`` seconds (≥ 5): its power is the counter's
   difference between the first and last refresh inside the phase over the time between
   them (the GPU is busy throughout);
2. interleaved iterations for ``--seconds``: ``heavy ×4, (light, heavy) ×2, light ×4`` then
   an idle gap, the shape of a 1F1B stage's warm-up, steady state and cool-down;
3. each mix alone again (a drift check: the GPU is warmer now).

During phase 2 the rank's own machinery runs as in training: `CounterPoller` watches the
counter's refreshes (`perseus.client.gpu.sensing`), instructions are timed with CUDA events and
placed on the host clock from one synchronisation per iteration, the phase is cut into
`energy_windows`, and `perseus.schedulers.sweep.power_fit` fits each mix's power and the idle power
under both sampling models (the whole period; its last 25 %, arXiv 2312.02741). Reported
per mix: the estimate (± its standard error) against the mix run alone, and what today's
profiler would say (iteration mean power × time). Also reported: the refresh period and
read latency, whether the refreshes lie on one line (`periodic_ticks`), and both models'
residuals, which say whether this GPU's sensor samples the whole period.

Writes ``DIR/sensors-probe.json`` (every number, the windows included) and
``DIR/summary.md``; exits 1 if a mix's estimate is more than 5 % off its alone run.
``--max-s`` caps the whole run (phases are shortened, never skipped past the first).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perseus.client.gpu.sensing import CounterPoller, Tick, energy_windows, periodic_ticks
from perseus.schedulers.measurement import WindowRow
from perseus.schedulers.sweep.power_fit import MODELS, fit_windows

PATTERN = ["heavy"] * 4 + ["light", "heavy"] * 2 + ["light"] * 4
IDLE_GAP_S = 0.03
INSTRUCTION_S = 0.008
ALONE_PER_ITERATION = 12


@dataclass
class Phase:
    """One phase's instructions on the host clock, and its span."""

    name: str
    intervals: list[tuple[int, float, float]] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    """The kind of each index of the iteration's pattern."""
    iterations: list[tuple[float, float]] = field(default_factory=list)
    counter_mj: list[tuple[float, float, float, float]] = field(default_factory=list)
    """Per iteration, (host time, counter) read before it and after it (interleaved only:
    what today's profiler sees)."""

    @property
    def span(self) -> tuple[float, float]:
        return self.iterations[0][0], self.iterations[-1][1]


class CudaRunner:
    """The two mixes on a CUDA GPU, timed with events, one synchronisation per iteration."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        torch.backends.cuda.matmul.allow_tf32 = False
        n = 8192
        self.a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        self.b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        self.c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
        self.x = torch.randn(64 * 1024 * 1024, device="cuda")  # 256 MiB, far beyond L2
        self.reps = {"heavy": 1, "light": 1}
        for kind in ("heavy", "light"):  # repeats for about INSTRUCTION_S each
            self._run(kind, 3)
            torch.cuda.synchronize()
            start = time.perf_counter()
            self._run(kind, 10)
            torch.cuda.synchronize()
            each = (time.perf_counter() - start) / 10
            self.reps[kind] = max(1, round(INSTRUCTION_S / each))

    def _run(self, kind: str, reps: int) -> None:
        for _ in range(reps):
            if kind == "heavy":
                self.torch.matmul(self.a, self.b, out=self.c)
            else:
                self.x.mul_(0.999).add_(1e-3)

    def iteration(self, kinds: list[str]) -> tuple[float, float, list[tuple[float, float]]]:
        """Run `kinds` back to back: (host start, host end, [(start, end)] per instruction)."""
        torch = self.torch
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        events = []
        for kind in kinds:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            self._run(kind, self.reps[kind])
            end.record()
            events.append((begin, end))
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        spans = [
            (t0 + start.elapsed_time(b) / 1000, t0 + start.elapsed_time(e) / 1000)
            for b, e in events
        ]
        return t0, t1, spans


class EmulatedRunner:
    """The same on an emulated H100 (real sensors): to test this script without a GPU."""

    def __init__(self, gpu: Any) -> None:
        from zeus_power.device import Workload

        self.gpu = gpu
        self.power = {
            "heavy": gpu.busy_power_w(Workload(1.0, 0.0, activity=1.0)),
            "light": gpu.busy_power_w(Workload(0.2, 0.8, activity=0.35)),
        }

    def iteration(self, kinds: list[str]) -> tuple[float, float, list[tuple[float, float]]]:
        t0 = time.perf_counter()
        spans = []
        for kind in kinds:
            begin = time.perf_counter()
            self.gpu.begin_busy(self.power[kind])
            time.sleep(INSTRUCTION_S)
            duration = time.perf_counter() - begin
            self.gpu.end_busy(duration, self.power[kind] * duration)
            spans.append((begin, begin + duration))
        return t0, time.perf_counter(), spans


def run_phase(
    name: str,
    runner: Any,
    read_mj: Callable[[], float],
    pattern: list[str],
    seconds: float,
    deadline: float,
    gap_s: float = 0.0,
    *,
    read: bool = False,
) -> Phase:
    """Iterations of `pattern` for `seconds`; with `read`, the counter before and after each
    (2.4 ms a read on an H100: not in the alone phases, which must keep the GPU busy)."""
    phase = Phase(name, kinds=list(pattern))
    stop = min(time.monotonic() + seconds, deadline)
    while not phase.iterations or time.monotonic() < stop:
        if read:
            r0 = (time.perf_counter(), read_mj())
        t0, t1, spans = runner.iteration(pattern)
        if read:
            phase.counter_mj.append((*r0, time.perf_counter(), read_mj()))
        phase.iterations.append((t0, t1))
        phase.intervals.extend((k, a, b) for k, (a, b) in enumerate(spans))
        if gap_s:
            time.sleep(gap_s)
    return phase


def alone_power(phase: Phase, ticks: list[Tick], idle_w: float = 0.0) -> dict[str, float]:
    """A mix run alone: its power between the phase's first and last precise refresh, the
    host's short gaps between iterations (busy share just under 1) booked at `idle_w`."""
    start, end = phase.span
    inside = [
        k for k in periodic_ticks([k for k in ticks if start <= k.time_s <= end]) if k.precise
    ]
    if len(inside) < 2:
        return {"power_w": math.nan, "seconds": 0.0}
    a, b = inside[0], inside[-1]
    busy = sum(max(0.0, min(e, b.time_s) - max(s, a.time_s)) for _, s, e in phase.intervals)
    span = b.time_s - a.time_s
    durations = [e - s for _, s, e in phase.intervals]
    energy = (b.energy_mj - a.energy_mj) / 1000
    return {
        "power_w": (energy - idle_w * (span - busy)) / busy,
        "mean_power_w": energy / span,
        "seconds": span,
        "busy_share": busy / span,
        "instruction_s": statistics.median(durations),
    }


def analyse(phase: Phase, ticks: list[Tick]) -> dict[str, Any]:
    """The interleaved phase: windows, both models' fits, today's breakdown."""
    start, end = phase.span
    windows = energy_windows(ticks, phase.intervals, len(phase.kinds), start_s=start, end_s=end)
    units = [(0, kind, 0) for kind in phase.kinds]
    rows = []
    for w in windows:
        busy: dict = {}
        tail: dict = {}
        for unit, b, t in zip(units, w.busy_s, w.tail_busy_s, strict=True):
            busy[unit] = busy.get(unit, 0.0) + b
            tail[unit] = tail.get(unit, 0.0) + t
        rows.append(WindowRow(w.energy_j, w.time_s, busy, w.tail_s, tail))
    out: dict[str, Any] = {"windows": len(rows), "models": {}}
    for model in MODELS:
        fit = fit_windows(rows, model)
        if fit is None:
            continue
        out["models"][model] = {
            "rms_j": fit.rms_j,
            "idle_w": [fit.block.power_w, fit.block.se_w],
            **{u[1]: [e.power_w, e.se_w] for u, e in fit.units.items()},
        }
    if out["models"]:
        out["best"] = min(out["models"], key=lambda m: out["models"][m]["rms_j"])
    # Today's profiler: each instruction gets its iteration's mean power (counter reads at
    # the iteration's ends) times its time.
    today: dict[str, list[float]] = {"heavy": [], "light": []}
    n = len(phase.kinds)
    for it, (t0, e0, t1, e1) in enumerate(phase.counter_mj):
        power = (e1 - e0) / 1000 / max(t1 - t0, 1e-9)
        for k, _, _ in phase.intervals[it * n : (it + 1) * n]:
            today[phase.kinds[k]].append(power)
    out["today_w"] = {k: statistics.mean(v) for k, v in today.items() if v}
    out["instruction_s"] = {
        kind: statistics.median(e - s for k, s, e in phase.intervals if phase.kinds[k] == kind)
        for kind in ("heavy", "light")
    }
    out["rows"] = [
        {"energy_j": r.energy_j, "time_s": r.time_s, "busy": {u[1]: s for u, s in r.busy.items()}}
        for r in rows
    ]
    return out


def tick_facts(poller: CounterPoller, ticks: list[Tick]) -> dict[str, Any]:
    precise = [k for k in ticks if k.precise]
    gaps = [b.time_s - a.time_s for a, b in itertools.pairwise(precise)]
    line = periodic_ticks(ticks)
    return {
        "period_s": poller.period_s,
        "read_s": poller.read_s,
        "refreshes": len(ticks),
        "precise": len(precise),
        "median_gap_s": statistics.median(gaps) if gaps else None,
        "bracket_s": statistics.median(k.width_s for k in precise) if precise else None,
        "on_one_line": line != list(ticks),
    }


def gpu_state(gpu: Any) -> dict[str, Any]:
    state: dict[str, Any] = {"name": gpu.name(), "power_limit_mw": gpu.get_power_limit_mw()}
    try:
        import pynvml

        handle = pynvml.nvmlDeviceGetHandleByIndex(gpu.index)
        state["sm_clock_mhz"] = pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
    except Exception:  # emulated, or no pynvml: the clock is not essential
        pass
    return state


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=30.0, help="interleaved phase")
    parser.add_argument("--alone-s", type=float, default=6.0, help="each mix alone (>= 5)")
    parser.add_argument("--max-s", type=float, default=240.0, help="hard cap on the whole run")
    parser.add_argument("--emulated", action="store_true", help="an emulated H100, no GPU")
    args = parser.parse_args()
    deadline = time.monotonic() + args.max_s - 10.0  # leave time to analyse and write
    args.out.mkdir(parents=True, exist_ok=True)

    if args.emulated:
        from zeus_power.device import EmulatedGPU

        gpu: Any = EmulatedGPU(0, gpu_type="H100-SXM")
        runner: Any = EmulatedRunner(gpu)
    else:
        from bench_hook_gpu import ReadOnlyGPU

        from zeus_power.device import open_gpus

        gpu = ReadOnlyGPU(open_gpus([0], backend="nvml")[0])
        runner = CudaRunner()
    before = gpu_state(gpu)
    poller = CounterPoller(gpu.total_energy_mj, name="probe-counter")
    period = poller.wait_period(timeout_s=3.0)
    print(f"{before['name']}: counter refresh {period} s, read {poller.read_s * 1000:.2f} ms")
    read = gpu.total_energy_mj
    phases = {}
    try:
        for name, pattern, seconds, gap in (
            ("heavy alone", ["heavy"] * ALONE_PER_ITERATION, args.alone_s, 0.0),
            ("light alone", ["light"] * ALONE_PER_ITERATION, args.alone_s, 0.0),
            ("interleaved", PATTERN, args.seconds, IDLE_GAP_S),
            ("heavy alone, after", ["heavy"] * ALONE_PER_ITERATION, args.alone_s, 0.0),
            ("light alone, after", ["light"] * ALONE_PER_ITERATION, args.alone_s, 0.0),
        ):
            if time.monotonic() > deadline and phases:
                print(f"time cap: skipping {name}")
                continue
            phases[name] = run_phase(
                name, runner, read, pattern, seconds, deadline, gap, read=name == "interleaved"
            )
            print(f"{name}: {len(phases[name].iterations)} iterations", flush=True)
        time.sleep(0.25)  # one more refresh after the last phase
    finally:
        ticks = poller.ticks(-math.inf, math.inf)
        poller.close()
    after = gpu_state(gpu)
    result: dict[str, Any] = {
        "gpu_before": before,
        "gpu_after": after,
        "writes_dropped": dict(getattr(gpu, "writes", {})),
        "emulated": args.emulated,
        "ticks": tick_facts(poller, ticks),
    }
    ok = True
    lines = [f"# Per-kind energy from energy windows, {before['name']}", ""]
    inter = analyse(phases["interleaved"], ticks) if "interleaved" in phases else None
    best = inter.get("best") if inter else None
    idle_w = inter["models"][best]["idle_w"][0] if inter and best else 0.0
    result["alone"] = {n: alone_power(p, ticks, idle_w) for n, p in phases.items() if "alone" in n}
    if inter is not None:
        result["interleaved"] = inter
        lines += [
            f"Refresh period {result['ticks']['period_s']} s (median gap "
            f"{result['ticks']['median_gap_s']}), read {poller.read_s * 1000:.2f} ms, refreshes "
            f"on one line: {result['ticks']['on_one_line']}; {inter['windows']} windows; "
            f"residual per window: "
            + ", ".join(f"{m} {v['rms_j']:.3f} J" for m, v in inter["models"].items())
            + f" (kept: {best})",
            "",
            "| mix | alone, before / after (W) | estimated from windows (W) | error | "
            "today's: iteration mean power (W) | error | energy per instruction, estimated (J) |",
            "|---|---|---|---|---|---|---|",
        ]
        for kind in ("heavy", "light"):
            ref = [result["alone"].get(f"{kind} alone", {}).get("power_w", math.nan)]
            ref.append(result["alone"].get(f"{kind} alone, after", {}).get("power_w", math.nan))
            ref_w = (
                statistics.mean(r for r in ref if math.isfinite(r))
                if any(math.isfinite(r) for r in ref)
                else math.nan
            )
            est_w, se_w = inter["models"][best][kind] if best else (math.nan, math.nan)
            today_w = inter["today_w"].get(kind, math.nan)
            err = est_w / ref_w - 1
            ok &= abs(err) <= 0.05
            lines.append(
                f"| {kind} | {ref[0]:.1f} / {ref[1]:.1f} | {est_w:.1f} ± {se_w:.1f} | {err:+.1%} "
                f"| {today_w:.1f} | {today_w / ref_w - 1:+.1%} "
                f"| {est_w * inter['instruction_s'][kind]:.3f} |"
            )
    lines += ["", f"GPU before: {before}", f"GPU after: {after}"]
    (args.out / "sensors-probe.json").write_text(json.dumps(result, indent=1, default=str))
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
