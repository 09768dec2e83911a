"""`ZeusMonitor`: time and GPU energy of named measurement windows.

```python
monitor = ZeusMonitor(gpu_indices=[0])
monitor.begin_window("epoch")
...                                        # windows nest and overlap freely, by name
m = monitor.end_window("epoch")            # m.time_s, m.gpu_energy_j[0], m.total_energy_j
```

A measurement taken on an emulated GPU says so (`Measurement.emulated`); the monitor never
picks the emulator by itself (see `zeus_power.device.open_gpus`).

Energy comes from each GPU's energy counter when it has one (Volta and newer); for GPUs
without one a background thread polls `power_usage_mw()` every `poll_interval_s` while a
window is open and integrates it. Each reading is taken as the power of the interval
that ends at it (NVML reports power averaged over the last sample period), so the
integral is exact for piecewise-constant power sampled at the change points. Readings are
also taken at every window boundary.

The time source is injectable (`time_fn`, default `time.monotonic`); pass the emulator's
`VirtualClock` to measure in virtual time.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from zeus_power.device.base import GPU
from zeus_power.errors import ZeusConfigError, ZeusMonitorError

__all__ = ["Measurement", "ZeusMonitor", "aggregate_over_ranks"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Measurement:
    """Time and per-GPU energy of one window."""

    time_s: float
    """Elapsed time of the window, in seconds."""
    gpu_energy_j: dict[int, float] = field(default_factory=dict)
    """Energy of each GPU (by index) over the window, in joules."""
    emulated: bool = False
    """True when any measured GPU is emulated: the numbers are the emulator's, not measured."""

    @property
    def total_energy_j(self) -> float:
        """Energy summed over the GPUs, in joules."""
        return float(sum(self.gpu_energy_j.values()))

    # Zeus-compatible names.
    @property
    def time(self) -> float:
        """Alias of `time_s` (Zeus's name)."""
        return self.time_s

    @property
    def energy(self) -> dict[int, float]:
        """Alias of `gpu_energy_j` (Zeus's name)."""
        return self.gpu_energy_j

    @property
    def total_energy(self) -> float:
        """Alias of `total_energy_j` (Zeus's name)."""
        return self.total_energy_j


@dataclass(frozen=True)
class _Window:
    start_s: float
    start_energy_j: dict[int, float]


class _PowerIntegrator:
    """Integrates `power_usage_mw()` of GPUs without an energy counter.

    The cumulative energy only grows while the integrator runs (some window is open);
    windows use differences of it, so the gaps between runs do not matter.
    """

    def __init__(
        self, gpus: Sequence[GPU], time_fn: Callable[[], float], poll_interval_s: float
    ) -> None:
        self._gpus = list(gpus)
        self._time_fn = time_fn
        self._poll_interval_s = poll_interval_s
        self._lock = threading.Lock()
        self._energy_j = {gpu.index: 0.0 for gpu in self._gpus}
        self._last_s: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> dict[int, float]:
        """Take a reading now and return the cumulative energies."""
        with self._lock:
            now_s = self._time_fn()
            if self._last_s is not None:
                dt_s = max(now_s - self._last_s, 0.0)
                for gpu in self._gpus:
                    self._energy_j[gpu.index] += gpu.power_usage_mw() / 1000.0 * dt_s
            self._last_s = now_s
            return dict(self._energy_j)

    def start(self) -> None:
        if self._thread is not None:
            return
        with self._lock:
            self._last_s = self._time_fn()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="zeus-power-poller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join()
        with self._lock:
            self._last_s = None

    def _run(self) -> None:
        while not self._stop.wait(self._poll_interval_s):
            try:
                self.sample()
            except Exception:  # A failed reading must not kill the thread silently.
                logger.exception("Power polling failed; the window energy will be short")


class ZeusMonitor:
    """Measure time and GPU energy over named, possibly nested or overlapping, windows.

    Args:
        gpu_indices: Indices of the GPUs to measure. With `gpus`, selects among them by
            `GPU.index`; otherwise opened with `zeus_power.device.open_gpus`. Default: all.
        gpus: GPU handles to measure (e.g. emulated GPUs); default: open them.
        backend: Device backend for `open_gpus` when `gpus` is not given.
        time_fn: Time source in seconds; default `time.monotonic`.
        poll_interval_s: Polling period for GPUs without an energy counter.
    """

    def __init__(
        self,
        gpu_indices: Sequence[int] | None = None,
        *,
        gpus: Sequence[GPU] | None = None,
        backend: str | None = None,
        time_fn: Callable[[], float] | None = None,
        poll_interval_s: float = 0.1,
    ) -> None:
        if not poll_interval_s > 0:
            raise ZeusConfigError(f"poll_interval_s must be positive, got {poll_interval_s!r}.")
        if gpus is None:
            from zeus_power.device import open_gpus

            gpus = open_gpus(gpu_indices, backend=backend)
        elif gpu_indices is not None:
            by_index = {gpu.index: gpu for gpu in gpus}
            missing = [i for i in gpu_indices if i not in by_index]
            if missing:
                raise ZeusConfigError(
                    f"gpu_indices {missing} are not among the given GPUs {sorted(by_index)}."
                )
            gpus = [by_index[i] for i in gpu_indices]
        if not gpus:
            raise ZeusConfigError("ZeusMonitor needs at least one GPU; got none.")
        indices = [gpu.index for gpu in gpus]
        if len(set(indices)) != len(indices):
            raise ZeusConfigError(f"GPU indices {indices} contain duplicates.")
        self.gpus: list[GPU] = list(gpus)
        self.gpu_indices: list[int] = indices
        self.emulated = any(gpu.emulated for gpu in self.gpus)
        """Whether any measured GPU is emulated (then every `Measurement` says so)."""
        self._time_fn = time_fn if time_fn is not None else time.monotonic
        self._counter_gpus = [gpu for gpu in self.gpus if gpu.supports_energy_counter()]
        polled = [gpu for gpu in self.gpus if not gpu.supports_energy_counter()]
        self._integrator = (
            _PowerIntegrator(polled, self._time_fn, poll_interval_s) if polled else None
        )
        self._windows: dict[str, _Window] = {}
        self._lock = threading.Lock()

    def _energies_j(self) -> dict[int, float]:
        energy = {gpu.index: gpu.total_energy_mj() / 1000.0 for gpu in self._counter_gpus}
        if self._integrator is not None:
            energy.update(self._integrator.sample())
        return {index: energy[index] for index in self.gpu_indices}

    def begin_window(self, key: str) -> None:
        """Open the window `key`.

        Raises:
            ZeusMonitorError: A window named `key` is already open.
        """
        with self._lock:
            if key in self._windows:
                raise ZeusMonitorError(
                    f"Measurement window {key!r} is already open; end it first or use another name."
                )
            if self._integrator is not None and not self._windows:
                self._integrator.start()
            start_s = self._time_fn()
            self._windows[key] = _Window(start_s=start_s, start_energy_j=self._energies_j())

    def end_window(self, key: str, cancel: bool = False) -> Measurement:
        """Close the window `key` and return its measurement (zeros when `cancel`).

        Raises:
            ZeusMonitorError: No window named `key` is open.
        """
        with self._lock:
            window = self._windows.pop(key, None)
            if window is None:
                raise ZeusMonitorError(
                    f"Measurement window {key!r} is not open; open windows: "
                    f"{sorted(self._windows)}."
                )
            if cancel:
                result = Measurement(
                    time_s=0.0,
                    gpu_energy_j=dict.fromkeys(self.gpu_indices, 0.0),
                    emulated=self.emulated,
                )
            else:
                end_energy = self._energies_j()
                end_s = self._time_fn()
                result = Measurement(
                    time_s=max(end_s - window.start_s, 0.0),
                    gpu_energy_j={
                        i: max(end_energy[i] - window.start_energy_j[i], 0.0)
                        for i in self.gpu_indices
                    },
                    emulated=self.emulated,
                )
            if self._integrator is not None and not self._windows:
                self._integrator.stop()
            return result

    def open_windows(self) -> list[str]:
        """Names of the open windows."""
        with self._lock:
            return sorted(self._windows)

    def close(self) -> None:
        """Drop open windows and stop the polling thread."""
        with self._lock:
            self._windows.clear()
            if self._integrator is not None:
                self._integrator.stop()

    def __enter__(self) -> ZeusMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def aggregate_over_ranks(time_s: float, energy_j: float) -> tuple[float, float]:
    """Max of `time_s` and sum of `energy_j` over the ranks of the default process group.

    A no-op (returns its arguments) unless `torch.distributed` is imported and
    initialised. Every rank must call it at the same point, like any collective.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return time_s, energy_j
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return time_s, energy_j
    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    t = torch.tensor([time_s], dtype=torch.float64, device=device)
    e = torch.tensor([energy_j], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    dist.all_reduce(e, op=dist.ReduceOp.SUM)
    return float(t.item()), float(e.item())
