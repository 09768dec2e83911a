"""Pluggable frequency schedulers, chosen by ``PERSEUS_SCHEDULER``.

`SCHEDULERS` (`schedulers.registry`) is the explicit name → class registry the coordinator
resolves ``PERSEUS_SCHEDULER`` against; a ``module:Class`` name loads a plugin instead.
"""

from schedulers.all_max import AllMaxFrequency
from schedulers.base import FrequencyScheduler, build_scheduler, check_scheduler_args
from schedulers.envpipe import EnvPipe
from schedulers.perseus_scheduler import Perseus
from schedulers.pipeline import PipelineScheduler
from schedulers.point_solution import PointSolution
from schedulers.profiler import InstructionProfiler
from schedulers.registry import SCHEDULERS, resolve_scheduler
from schedulers.zeus import ZeusGlobal, ZeusPerStage

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
