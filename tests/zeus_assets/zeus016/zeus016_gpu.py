"""Zeus 0.16's GPU layer, emulated: the only part of Zeus the integration tests replace.

Runs inside the Zeus 0.16 virtual environment (pydantic 1; it imports nothing of ours).
`install(num_gpus)` puts emulated A40s where Zeus's `zeus.device.get_gpus()` finds its GPUs
(the module's singleton), so Zeus's own `ZeusMonitor`, `BatchSizeOptimizer`,
`PipelineFrequencyOptimizer` and `FrequencyController` run unmodified on them; and it makes
torch's CUDA calls that Zeus makes on a GPU machine (`torch.cuda.set_device`,
`torch.cuda.synchronize`, `torch.cuda.is_available`) no-ops, since this machine's torch is
a CPU build. Nothing else of Zeus or torch is touched.

An emulated GPU draws ``70 W + 230 W·(f/1740)^2.5`` (capped by its power limit) at its locked
SM clock f, and its energy counter integrates that over wall time. Every clock it is locked
at is appended to the JSON-lines file ``$ZEUS016_GPU_LOG`` (when set) with the process id,
so a test can see which clocks Zeus's frequency controller really applied.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence

import torch
import zeus.device.gpu as zeus_gpu
from zeus.device.gpu import common as gpu_common

NAME = "NVIDIA A40"
MAX_SM_MHZ = 1740
SM_CLOCKS_MHZ = list(range(MAX_SM_MHZ, 209, -15))
MEMORY_CLOCK_MHZ = 7251
POWER_LIMITS_MW = (100_000, 300_000)


class EmulatedGPU(gpu_common.GPU):
    """One emulated A40 behind Zeus's `GPU` interface."""

    def __init__(self, gpu_index: int) -> None:
        super().__init__(gpu_index)
        self._lock = threading.Lock()
        self._locked_mhz: int | None = None
        self._power_limit_mw = POWER_LIMITS_MW[1]
        self._energy_mj = 0.0
        self._since = time.monotonic()

    # ------------------------------------------------------------------ model
    def _power_w(self) -> float:
        f = self._locked_mhz or MAX_SM_MHZ
        return min(70.0 + 230.0 * (f / MAX_SM_MHZ) ** 2.5, self._power_limit_mw / 1000.0)

    def _advance(self) -> None:
        now = time.monotonic()
        self._energy_mj += self._power_w() * (now - self._since) * 1000.0
        self._since = now

    def _log(self, event: str, mhz: int | None) -> None:
        path = os.environ.get("ZEUS016_GPU_LOG")
        if path:
            line = {"pid": os.getpid(), "gpu": self.gpu_index, "event": event, "mhz": mhz}
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")

    # ------------------------------------------------------------------ Zeus's GPU API
    @property
    def supports_nonblocking_setters(self) -> bool:
        return False

    def get_name(self) -> str:
        return NAME

    def get_power_management_limit_constraints(self) -> tuple[int, int]:
        return POWER_LIMITS_MW

    def get_power_management_limit(self) -> int:
        return self._power_limit_mw

    def set_power_management_limit(self, power_limit_mw: int, block: bool = True) -> None:
        if not POWER_LIMITS_MW[0] <= power_limit_mw <= POWER_LIMITS_MW[1]:
            raise gpu_common.ZeusGPUInvalidArgError(f"power limit {power_limit_mw} mW")
        with self._lock:
            self._advance()
            self._power_limit_mw = power_limit_mw

    def reset_power_management_limit(self, block: bool = True) -> None:
        self.set_power_management_limit(POWER_LIMITS_MW[1], block)

    def set_persistence_mode(self, enabled: bool, block: bool = True) -> None:
        return None

    def get_persistence_mode(self) -> bool:
        return True

    def get_supported_memory_clocks(self) -> list[int]:
        return [MEMORY_CLOCK_MHZ]

    def set_memory_locked_clocks(
        self, min_clock_mhz: int, max_clock_mhz: int, block: bool = True
    ) -> None:
        raise gpu_common.ZeusGPUNotSupportedError("memory clocks are not lockable on an A40")

    def reset_memory_locked_clocks(self, block: bool = True) -> None:
        raise gpu_common.ZeusGPUNotSupportedError("memory clocks are not lockable on an A40")

    def get_supported_graphics_clocks(self, memory_clock_mhz: int | None = None) -> list[int]:
        return list(SM_CLOCKS_MHZ)

    def set_gpu_locked_clocks(
        self, min_clock_mhz: int, max_clock_mhz: int, block: bool = True
    ) -> None:
        if min_clock_mhz != max_clock_mhz or max_clock_mhz not in SM_CLOCKS_MHZ:
            raise gpu_common.ZeusGPUInvalidArgError(
                f"locked clocks {min_clock_mhz}..{max_clock_mhz} MHz are not one supported clock"
            )
        with self._lock:
            self._advance()
            self._locked_mhz = max_clock_mhz
        self._log("lock", max_clock_mhz)

    def reset_gpu_locked_clocks(self, block: bool = True) -> None:
        with self._lock:
            self._advance()
            self._locked_mhz = None
        self._log("reset", None)

    def get_average_power_usage(self) -> int:
        return int(self._power_w() * 1000)

    def get_instant_power_usage(self) -> int:
        return int(self._power_w() * 1000)

    def get_average_memory_power_usage(self) -> int:
        raise gpu_common.ZeusGPUNotSupportedError("no memory power reading on an A40")

    def supports_get_total_energy_consumption(self) -> bool:
        return True

    def get_total_energy_consumption(self) -> int:
        with self._lock:
            self._advance()
            return int(self._energy_mj)

    def get_gpu_temperature(self) -> int:
        return 40


class EmulatedGPUs(gpu_common.GPUs):
    """`num_gpus` emulated A40s behind Zeus's `GPUs` interface."""

    def __init__(self, ensure_homogeneous: bool = False, *, num_gpus: int = 1) -> None:
        self._gpus = [EmulatedGPU(i) for i in range(num_gpus)]

    def __del__(self) -> None:
        return None

    @property
    def gpus(self) -> Sequence[gpu_common.GPU]:
        return self._gpus


def install(num_gpus: int) -> None:
    """Make Zeus's `get_gpus()` answer `num_gpus` emulated A40s, and torch's CUDA calls no-ops."""
    zeus_gpu._gpus = EmulatedGPUs(num_gpus=num_gpus)
    torch.cuda.is_available = lambda: True
    torch.cuda.set_device = lambda device: None
    torch.cuda.synchronize = lambda device=None: None
