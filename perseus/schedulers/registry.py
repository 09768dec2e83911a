"""The scheduler registry: the only name → class map, and how a name becomes a class.

``PERSEUS_SCHEDULER`` stays a string in `perseus.settings.PerseusSettings`; the
coordinator resolves it here when it starts (`perseus.server.create_app`). A name is a
key of `SCHEDULERS` (``"AllMaxFrequency"``) or a plugin, ``"package.module:Class"``.
Errors list the valid names.
"""

from __future__ import annotations

import importlib
import inspect

from perseus.errors import ConfigurationError
from perseus.schedulers.all_max import AllMaxFrequency
from perseus.schedulers.base import FrequencyScheduler
from perseus.schedulers.envpipe import EnvPipe
from perseus.schedulers.perseus_scheduler.scheduler import Perseus
from perseus.schedulers.point_solution import PointSolution
from perseus.schedulers.profiler import InstructionProfiler
from perseus.schedulers.zeus import ZeusGlobal, ZeusPerStage

__all__ = ["SCHEDULERS", "resolve_scheduler", "scheduler_ref"]

SCHEDULERS: dict[str, type[FrequencyScheduler]] = {
    "AllMaxFrequency": AllMaxFrequency,
    "EnvPipe": EnvPipe,
    "InstructionProfiler": InstructionProfiler,
    "Perseus": Perseus,
    "PointSolution": PointSolution,
    "ZeusGlobal": ZeusGlobal,
    "ZeusPerStage": ZeusPerStage,
}


def _load_plugin(name: str) -> type:
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"Cannot import scheduler plugin module {module_name!r} (from {name!r}): {exc}"
        ) from exc
    try:
        cls = getattr(module, attr)
    except AttributeError as exc:
        raise ConfigurationError(f"Module {module_name!r} has no scheduler class {attr!r}") from exc
    if not inspect.isclass(cls):
        raise ConfigurationError(f"Scheduler plugin {name!r} is not a class")
    return cls  # type: ignore[no-any-return]


def resolve_scheduler(name: str) -> type:
    """The scheduler class `name` stands for (a registry name or ``module:Class``)."""
    name = name.strip()
    if ":" in name:
        return _load_plugin(name)
    try:
        return SCHEDULERS[name]
    except KeyError:
        raise ConfigurationError(
            f"Unknown scheduler {name!r}. Valid names: {', '.join(sorted(SCHEDULERS))}; "
            "or give a plugin as 'package.module:ClassName'."
        ) from None


def scheduler_ref(cls: type) -> str:
    """A name `resolve_scheduler` turns back into `cls`."""
    if SCHEDULERS.get(cls.__name__) is cls:
        return cls.__name__
    return f"{cls.__module__}:{cls.__qualname__}"
