"""Pluggable frequency schedulers, chosen by ``PERSEUS_SCHEDULER``.

`SCHEDULERS` (`perseus.schedulers.registry`) is the explicit name → class registry the coordinator
resolves ``PERSEUS_SCHEDULER`` against; a ``module:Class`` name loads a plugin instead.
"""

from perseus.schedulers.all_max import AllMaxFrequency
from perseus.schedulers.base import FrequencyScheduler, build_scheduler, check_scheduler_args
from perseus.schedulers.envpipe import EnvPipe
from perseus.schedulers.perseus_scheduler.scheduler import Perseus
from perseus.schedulers.pipeline import PipelineScheduler
from perseus.schedulers.point_solution import PointSolution
from perseus.schedulers.profiler import InstructionProfiler
from perseus.schedulers.registry import SCHEDULERS, resolve_scheduler
from perseus.schedulers.zeus import ZeusGlobal, ZeusPerStage

__all__ = [
    "AllMaxFrequency",
    "EnvPipe",
    "FrequencyScheduler",
    "InstructionProfiler",
    "Perseus",
    "PipelineScheduler",
    "PointSolution",
    "SCHEDULERS",
    "ZeusGlobal",
    "ZeusPerStage",
    "build_scheduler",
    "check_scheduler_args",
    "resolve_scheduler",
]
