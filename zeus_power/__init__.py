"""zeus_power: the single-GPU side (Zeus-compatible) and the device layer.

- `zeus_power.device`: the one GPU interface (NVML and emulated backends, `open_gpus`);
- `ZeusMonitor`: energy and time of named windows;
- `GlobalPowerLimitOptimizer` with the `Energy`, `Time`, `ZeusCost`, `MaxSlowdownConstraint`
  selectors (and `HFGlobalPowerLimitOptimizer`, built on access; needs transformers);
- `zeus_cost` and `ZeusCostThresholdExceededError`;
- the batch-size optimizer: client `BatchSizeOptimizer`, in-process `LocalBatchSizeOptimizer`,
  server in `zeus_power.bso.server` (`perseus bso serve`);
- `ZeusMaster`, which drives a job's recurrences, and `zeus_power.simulate`, which replays them.

Every name is imported on first access (PEP 562), from the module `_EXPORTS` names: `import
zeus_power` loads no submodule, so the device layer, the monitor or the errors can be used
without the batch-size client's httpx or the server's FastAPI and SQLAlchemy.

Errors: one tree under `ZeusError`, the device's `GPUError` included (drawn in
`zeus_power.errors`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zeus_power.bso.client import BatchSizeOptimizer
    from zeus_power.bso.local import LocalBatchSizeOptimizer
    from zeus_power.bso.models import JobSpec
    from zeus_power.device import (
        DVFSModel,
        EmulatedGPU,
        GPUError,
        VirtualClock,
        Workload,
        open_gpus,
    )
    from zeus_power.errors import (
        ZeusBSOConfigError,
        ZeusBSOConflictError,
        ZeusBSOError,
        ZeusBSOJobNotFoundError,
        ZeusBSOOperationOrderError,
        ZeusBSORuntimeError,
        ZeusBSORuntimError,
        ZeusBSOTrainFailError,
        ZeusConfigError,
        ZeusCostThresholdExceededError,
        ZeusError,
        ZeusMasterError,
        ZeusMonitorError,
        ZeusProfileError,
    )
    from zeus_power.job import HistoryEntry, Job
    from zeus_power.master import ZeusMaster
    from zeus_power.metric import zeus_cost
    from zeus_power.monitor import Measurement, ZeusMonitor
    from zeus_power.power_limit import (
        Done,
        GlobalPowerLimitOptimizer,
        Profiling,
        Ready,
        ShortEpochWarning,
        Warmup,
    )
    from zeus_power.power_limit.selectors import (
        Energy,
        MaxSlowdownConstraint,
        OptimumSelector,
        PowerLimitMeasurement,
        Time,
        ZeusCost,
    )
    from zeus_power.training import TrainingEnv, TrainingResult

__all__ = [
    "BatchSizeOptimizer",
    "DVFSModel",
    "Done",
    "EmulatedGPU",
    "Energy",
    "GPUError",
    "GlobalPowerLimitOptimizer",
    "HistoryEntry",
    "Job",
    "JobSpec",
    "LocalBatchSizeOptimizer",
    "MaxSlowdownConstraint",
    "Measurement",
    "OptimumSelector",
    "PowerLimitMeasurement",
    "Profiling",
    "Ready",
    "ShortEpochWarning",
    "Time",
    "TrainingEnv",
    "TrainingResult",
    "VirtualClock",
    "Warmup",
    "Workload",
    "ZeusBSOConfigError",
    "ZeusBSOConflictError",
    "ZeusBSOError",
    "ZeusBSOJobNotFoundError",
    "ZeusBSOOperationOrderError",
    "ZeusBSORuntimError",
    "ZeusBSORuntimeError",
    "ZeusBSOTrainFailError",
    "ZeusConfigError",
    "ZeusCost",
    "ZeusCostThresholdExceededError",
    "ZeusError",
    "ZeusMaster",
    "ZeusMasterError",
    "ZeusMonitor",
    "ZeusMonitorError",
    "ZeusProfileError",
    "open_gpus",
    "zeus_cost",
]

_EXPORTS: dict[str, str] = {
    "BatchSizeOptimizer": "zeus_power.bso.client",
    "DVFSModel": "zeus_power.device",
    "Done": "zeus_power.power_limit",
    "EmulatedGPU": "zeus_power.device",
    "Energy": "zeus_power.power_limit.selectors",
    "GPUError": "zeus_power.device",
    "GlobalPowerLimitOptimizer": "zeus_power.power_limit",
    "HistoryEntry": "zeus_power.job",
    "Job": "zeus_power.job",
    "JobSpec": "zeus_power.bso.models",
    "LocalBatchSizeOptimizer": "zeus_power.bso.local",
    "MaxSlowdownConstraint": "zeus_power.power_limit.selectors",
    "Measurement": "zeus_power.monitor",
    "OptimumSelector": "zeus_power.power_limit.selectors",
    "PowerLimitMeasurement": "zeus_power.power_limit.selectors",
    "Profiling": "zeus_power.power_limit",
    "Ready": "zeus_power.power_limit",
    "ShortEpochWarning": "zeus_power.power_limit",
    "Time": "zeus_power.power_limit.selectors",
    "TrainingEnv": "zeus_power.training",
    "TrainingResult": "zeus_power.training",
    "VirtualClock": "zeus_power.device",
    "Warmup": "zeus_power.power_limit",
    "Workload": "zeus_power.device",
    "ZeusBSOConfigError": "zeus_power.errors",
    "ZeusBSOConflictError": "zeus_power.errors",
    "ZeusBSOError": "zeus_power.errors",
    "ZeusBSOJobNotFoundError": "zeus_power.errors",
    "ZeusBSOOperationOrderError": "zeus_power.errors",
    "ZeusBSORuntimError": "zeus_power.errors",
    "ZeusBSORuntimeError": "zeus_power.errors",
    "ZeusBSOTrainFailError": "zeus_power.errors",
    "ZeusConfigError": "zeus_power.errors",
    "ZeusCost": "zeus_power.power_limit.selectors",
    "ZeusCostThresholdExceededError": "zeus_power.errors",
    "ZeusError": "zeus_power.errors",
    "ZeusMaster": "zeus_power.master",
    "ZeusMasterError": "zeus_power.errors",
    "ZeusMonitor": "zeus_power.monitor",
    "ZeusMonitorError": "zeus_power.errors",
    "ZeusProfileError": "zeus_power.errors",
    "open_gpus": "zeus_power.device",
    "zeus_cost": "zeus_power.metric",
    # Needs transformers; built on first access (see zeus_power.power_limit). Not in
    # `__all__`, so that `from zeus_power import *` does not need transformers.
    "HFGlobalPowerLimitOptimizer": "zeus_power.power_limit",
}
"""Public name -> the module it is imported from on first access."""

_SUBMODULES = frozenset(
    {
        "bso",
        "cli",
        "device",
        "errors",
        "master",
        "metric",
        "monitor",
        "power_limit",
        "simulate",
        "training",
    }
)
"""Submodules reachable as attributes (`zeus_power.monitor`) without importing them first."""


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is not None:
        value = getattr(importlib.import_module(module_name), name)
        globals()[name] = value  # Later lookups skip __getattr__.
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
