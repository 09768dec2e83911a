"""The power-limit optimizer, Zeus's `GlobalPowerLimitOptimizer`, and its parts.

- `GlobalPowerLimitOptimizer` (`optimizer`): profiles each power limit for a number of
  training steps, then applies the optimum;
- `states`: the states `Ready`, `Warmup`, `Profiling`, `Done`, `PowerLimitProfile` (the
  file the measurements are saved to and loaded from) and `ShortEpochWarning`;
- `selectors`: `PowerLimitMeasurement`, and `OptimumSelector` with its strategies
  `Energy`, `Time`, `ZeusCost`, `MaxSlowdownConstraint`;
- `HFGlobalPowerLimitOptimizer`, a Hugging Face `TrainerCallback` wrapper (`hf`: built on
  first access; needs `transformers`).

Zeus users import every one of them from here.
"""

from __future__ import annotations

from typing import Any

from zeus_power.power_limit.optimizer import GlobalPowerLimitOptimizer
from zeus_power.power_limit.selectors import (
    Energy,
    MaxSlowdownConstraint,
    OptimumSelector,
    PowerLimitMeasurement,
    Time,
    ZeusCost,
)
from zeus_power.power_limit.states import (
    Done,
    PowerLimitProfile,
    Profiling,
    Ready,
    ShortEpochWarning,
    Warmup,
)

__all__ = [
    "Done",
    "Energy",
    "GlobalPowerLimitOptimizer",
    "MaxSlowdownConstraint",
    "OptimumSelector",
    "PowerLimitMeasurement",
    "PowerLimitProfile",
    "Profiling",
    "Ready",
    "ShortEpochWarning",
    "Time",
    "Warmup",
    "ZeusCost",
]


def __getattr__(name: str) -> Any:
    # `HFGlobalPowerLimitOptimizer` subclasses transformers' TrainerCallback, so it is built
    # on first access (and cached): importing this package must not need transformers. It
    # is left out of `__all__` so that `import *` does not need it either.
    if name == "HFGlobalPowerLimitOptimizer":
        from zeus_power.power_limit.hf import build_hf_class

        return build_hf_class(GlobalPowerLimitOptimizer)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
