"""The device layer: one `GPU` interface, two backends, and a factory.

```python
from zeus_power.device import open_gpus, VirtualClock, Workload

gpus = open_gpus([0, 1], backend="emulated", gpu_type="A40", clock=VirtualClock())
gpus[0].lock_sm_clocks(1200, 1200)
gpus[0].execute(Workload(compute_s_at_max=0.1, memory_s=0.03))   # advances the clock
```

`open_gpus` chooses the backend from its argument or `ZEUS_GPU_BACKEND` (`nvml`,
`emulated`, `zeusd`: privileged writes through a Zeus daemon at `ZEUSD_SOCK_PATH` or
`ZEUSD_HOST_PORT`, or `auto`: the daemon when one of those is set, else NVML). Emulation is
only ever used when asked for: `auto` with no NVIDIA driver is a `GPUInitError` naming the
opt-in (`ZEUS_GPU_BACKEND=emulated`), never a silent switch to invented numbers. There is no global
GPU object; callers hold the list they were given. Errors are the `GPUError` tree in
`zeus_power.device.base`, part of the package's `ZeusError` tree.

Modules: `base` (the `GPU` interface and its errors), `factory` (`open_gpus` and its
`DeviceSettings`), `specs` (GPU types), `dvfs` (the
emulator's model: `DVFSModel`, `Workload`), `clock` (`VirtualClock`), `emulated`
(`EmulatedGPU`), `nvml` (`NVMLGPU`, imported only when NVML is asked for), `zeusd`
(`ZeusdGPU`, the daemon's client, imported only when the daemon is asked for) and
`calibration` (fitting the model to measurements; needs scipy, imported on its own). The
names below are imported from them when first asked for: `perseus solve` reads a GPU's
spec without paying for the emulator's settings (pydantic-settings and asyncio, 30 ms).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zeus_power.device.base import (
        GPU,
        GPUError,
        GPUInitError,
        GPUNotSupportedError,
        GPUPermissionError,
        GPUValueError,
    )
    from zeus_power.device.clock import VirtualClock
    from zeus_power.device.dvfs import DEFAULT_ACTIVITY, DVFSModel, Execution, Sweep, Workload
    from zeus_power.device.emulated import EmulatedGPU
    from zeus_power.device.factory import (
        BACKENDS,
        CALIBRATED_POWER_DECAY_S,
        DeviceSettings,
        open_gpus,
    )
    from zeus_power.device.sensors import IDEAL_SENSORS, REAL_SENSORS, SensorSpec
    from zeus_power.device.specs import GPU_SPECS, GPUSpec, get_gpu_spec, gpu_type_names

_HOME = {
    "BACKENDS": "factory",
    "CALIBRATED_POWER_DECAY_S": "factory",
    "DEFAULT_ACTIVITY": "dvfs",
    "DEFAULT_SWITCH_LATENCY_MS": "factory",
    "DVFSModel": "dvfs",
    "DeviceSettings": "factory",
    "EmulatedGPU": "emulated",
    "Execution": "dvfs",
    "GPU": "base",
    "GPUError": "base",
    "GPUInitError": "base",
    "GPUNotSupportedError": "base",
    "GPUPermissionError": "base",
    "GPUSpec": "specs",
    "GPUValueError": "base",
    "GPU_SPECS": "specs",
    "IDEAL_SENSORS": "sensors",
    "MAX_SWITCH_LATENCY_MS": "factory",
    "REAL_SENSORS": "sensors",
    "SensorSpec": "sensors",
    "Sweep": "dvfs",
    "VirtualClock": "clock",
    "Workload": "dvfs",
    "get_gpu_spec": "specs",
    "gpu_type_names": "specs",
    "open_gpus": "factory",
}
"""Each exported name and the module it lives in."""

__all__ = [
    "BACKENDS",
    "CALIBRATED_POWER_DECAY_S",
    "DEFAULT_ACTIVITY",
    "DVFSModel",
    "DeviceSettings",
    "EmulatedGPU",
    "Execution",
    "GPU",
    "GPUError",
    "GPUInitError",
    "GPUNotSupportedError",
    "GPUPermissionError",
    "GPUSpec",
    "GPUValueError",
    "GPU_SPECS",
    "IDEAL_SENSORS",
    "REAL_SENSORS",
    "SensorSpec",
    "Sweep",
    "VirtualClock",
    "Workload",
    "get_gpu_spec",
    "gpu_type_names",
    "open_gpus",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME})
