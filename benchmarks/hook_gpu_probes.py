"""What `bench_hook_gpu.py` puts around the hook on a real GPU: a read-only GPU, hooks that
only synchronise or probe, an NVML power sampler, and how their readings are summed up."""

from __future__ import annotations

import collections
import itertools
import statistics
import threading
import time
from typing import Any


class ReadOnlyGPU:
    """An NVML GPU whose clock and power-limit setters do nothing (counted in `writes`)."""

    def __init__(self, gpu: Any) -> None:
        self._gpu = gpu
        self.index = gpu.index
        self.writes: collections.Counter[str] = collections.Counter()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gpu, name)

    def __repr__(self) -> str:
        return f"ReadOnlyGPU({self._gpu!r})"

    def lock_sm_clocks(self, min_mhz: int, max_mhz: int) -> None:
        self.writes["lock_sm_clocks"] += 1

    def reset_sm_clocks(self) -> None:
        self.writes["reset_sm_clocks"] += 1

    def set_power_limit_mw(self, limit_mw: int) -> None:
        self.writes["set_power_limit_mw"] += 1


class NullHook:
    def on_step_begin(self) -> None: ...
    def on_step_end(self) -> None: ...
    def on_instruction_begin(self, name: str, **_: Any) -> None: ...
    def on_instruction_end(self, name: str, **_: Any) -> None: ...


class SyncOnly(NullHook):
    def __init__(self, sync: Any) -> None:
        self.sync = sync

    def on_instruction_begin(self, name: str, **_: Any) -> None:
        self.sync()

    def on_instruction_end(self, name: str, **_: Any) -> None:
        self.sync()


class Probe(NullHook):
    """Synchronises around each instruction and notes its window and energy counter."""

    def __init__(self, sync: Any, read_mj: Any) -> None:
        self.sync, self.read_mj = sync, read_mj
        self.windows: list[tuple[str, float, float, float, float]] = []

    def on_instruction_begin(self, name: str, **_: Any) -> None:
        self.sync()
        self._t0, self._e0 = time.perf_counter(), self.read_mj()

    def on_instruction_end(self, name: str, **_: Any) -> None:
        self.sync()
        self.windows.append((name, self._t0, time.perf_counter(), self._e0, self.read_mj()))


class Sampler:
    """A thread reading NVML power (averaged and instant) and the energy counter."""

    def __init__(self, handle: Any, period_s: float) -> None:
        import pynvml

        self.pynvml, self.handle, self.period_s = pynvml, handle, period_s
        self.samples: list[tuple[float, float, float | None, float]] = []
        self._stop = threading.Event()
        self._instant_ok = True
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _instant_w(self) -> float | None:
        if not self._instant_ok:
            return None
        pynvml = self.pynvml
        try:
            field = getattr(pynvml, "NVML_FI_DEV_POWER_INSTANT", 186)
            value = pynvml.nvmlDeviceGetFieldValues(self.handle, [field])[0]
            if value.nvmlReturn != 0:
                self._instant_ok = False
                return None
            return float(value.value.uiVal) / 1000.0
        except Exception:
            self._instant_ok = False
            return None

    def _run(self) -> None:
        pynvml = self.pynvml
        while not self._stop.is_set():
            t = time.perf_counter()
            avg_w = pynvml.nvmlDeviceGetPowerUsage(self.handle) / 1000.0
            inst_w = self._instant_w()
            mj = float(pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
            self.samples.append((t, avg_w, inst_w, mj))
            time.sleep(self.period_s)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def integrate(samples: list[tuple[float, float]], t0: float, t1: float) -> float | None:
    """Joules of a sample-and-hold power series over [t0, t1]."""
    if not samples or samples[0][0] > t0:
        return None
    energy, prev_t, prev_w = 0.0, t0, None
    for t, w in samples:
        if t <= t0:
            prev_w = w
            continue
        if prev_w is not None:
            energy += prev_w * (min(t, t1) - prev_t)
        prev_t, prev_w = min(t, t1), w
        if t >= t1:
            break
    if prev_t < t1 and prev_w is not None:
        energy += prev_w * (t1 - prev_t)
    return energy


def change_period_ms(series: list[tuple[float, float]]) -> float | None:
    changes = [t for (_, u), (t, v) in itertools.pairwise(series) if v != u]
    if len(changes) < 3:
        return None
    return statistics.median(b - a for a, b in itertools.pairwise(changes)) * 1000.0


def summarize(values: list[float]) -> dict[str, float]:
    qs = statistics.quantiles(values, n=10) if len(values) >= 2 else [values[0]] * 9
    return {"median": statistics.median(values), "p10": qs[0], "p90": qs[-1], "n": len(values)}
