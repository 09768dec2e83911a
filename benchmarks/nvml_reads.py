"""`nvml_probe.py`'s reads of a real GPU: the device's figures and the checks on them, the
power it draws idle, blocked and busy, and energy windows by counter and by polling.
`check` records a failed check in `FAILURES`, which the probe's exit status reports."""

from __future__ import annotations

import itertools
import math
import statistics
import threading
import time
from collections import Counter
from typing import Any

from zeus_power.device import (
    GPU_SPECS,
    GPUError,
    GPUSpec,
    GPUValueError,
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
