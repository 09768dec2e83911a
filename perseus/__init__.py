"""Perseus: remove energy bloat from pipeline-parallel training.

Profile → DAG → frontier solver → plan → scheduler → coordinator → per-rank client → GPU.

The front door is `attach` (one call for a `torch.distributed.pipelining` schedule) and
`PerseusOptimizer` (the hook, for any other training loop); errors derive from
`PerseusError`. The names below are loaded on first use (PEP 562), so `import perseus` stays
cheap: it loads none of httpx, FastAPI, matplotlib, torch or the CLI's libraries (`attach`
loads torch when it is first used).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perseus.client import PerseusOptimizer
    from perseus.errors import (
        ConfigurationError,
        CoordinatorError,
        DeviceError,
        JobNotFoundError,
        PerseusError,
        PlanError,
        ProfileError,
        RankError,
        ScheduleError,
        SolverError,
    )
    from perseus.integrations.pipelining import attach
    from perseus.protocol import (
        FrequencySchedule,
        InstructionProfilingResult,
        JobInfo,
        OfflineProfilingResult,
        ProfilingResult,
        RankInfo,
    )
    from perseus.settings import PerseusSettings

_SOURCES = {
    "attach": "perseus.integrations.pipelining",
    "ConfigurationError": "perseus.errors",
    "CoordinatorError": "perseus.errors",
    "DeviceError": "perseus.errors",
    "FrequencySchedule": "perseus.protocol",
    "InstructionProfilingResult": "perseus.protocol",
    "JobInfo": "perseus.protocol",
    "JobNotFoundError": "perseus.errors",
    "OfflineProfilingResult": "perseus.protocol",
    "PerseusError": "perseus.errors",
    "PerseusOptimizer": "perseus.client",
    "PerseusSettings": "perseus.settings",
    "PlanError": "perseus.errors",
    "ProfileError": "perseus.errors",
    "ProfilingResult": "perseus.protocol",
    "RankError": "perseus.errors",
    "RankInfo": "perseus.protocol",
    "ScheduleError": "perseus.errors",
    "SolverError": "perseus.errors",
}

__all__ = [
    "ConfigurationError",
    "CoordinatorError",
    "DeviceError",
    "FrequencySchedule",
    "InstructionProfilingResult",
    "JobInfo",
    "JobNotFoundError",
    "OfflineProfilingResult",
    "PerseusError",
    "PerseusOptimizer",
    "PerseusSettings",
    "PlanError",
    "ProfileError",
    "ProfilingResult",
    "RankError",
    "RankInfo",
    "ScheduleError",
    "SolverError",
    "attach",
]


def __getattr__(name: str) -> Any:
    try:
        module = _SOURCES[name]
    except KeyError:
        raise AttributeError(f"module 'perseus' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
