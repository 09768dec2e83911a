"""zeus_power: the single-GPU side (Zeus-compatible) and the device layer.

- `zeus_power.device`: the one GPU interface (NVML and emulated backends, `open_gpus`);
- `ZeusMonitor`: energy and time of named windows;
- `GlobalPowerLimitOptimizer` with the `Energy`, `Time`, `ZeusCost`, `MaxSlowdownConstraint`
  selectors (and `HFGlobalPowerLimitOptimizer`, built on access; needs transformers);
- `zeus_cost` and `ZeusCostThresholdExceededError`;
- the batch-size optimizer: client `BatchSizeOptimizer`, in-process `LocalBatchSizeOptimizer`,
  server in `zeus_power.bso.server` (`perseus bso serve`);
- `ZeusMaster`, which drives a job's recurrences, and `zeus_power.simulate`, which replays them.

Errors: one tree under `ZeusError`, the device's `GPUError` included (drawn in
`zeus_power.errors`).
"""

from __future__ import annotations

from typing import Any

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
    ZeusError,
    ZeusMasterError,
    ZeusMonitorError,
    ZeusProfileError,
)
from zeus_power.master import HistoryEntry, Job, TrainingEnv, TrainingResult, ZeusMaster
from zeus_power.metric import ZeusCostThresholdExceededError, zeus_cost
from zeus_power.monitor import Measurement, ZeusMonitor
from zeus_power.power_limit import (
    Done,
    Energy,
    GlobalPowerLimitOptimizer,
    MaxSlowdownConstraint,
    OptimumSelector,
    PowerLimitMeasurement,
    Profiling,
    Ready,
    ShortEpochWarning,
    Time,
    Warmup,
    ZeusCost,
)

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


def __getattr__(name: str) -> Any:
    # Needs transformers; built on first access (see zeus_power.power_limit).
    if name == "HFGlobalPowerLimitOptimizer":
        from zeus_power import power_limit

        return power_limit.HFGlobalPowerLimitOptimizer
    raise AttributeError(f"module 'zeus_power' has no attribute {name!r}")
