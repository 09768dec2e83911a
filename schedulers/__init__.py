"""Pluggable frequency schedulers, chosen by ``PERSEUS_SCHEDULER``.

`SCHEDULERS` is the explicit name → class registry that `PerseusSettings` resolves short
names against; a ``module:Class`` name loads a plugin instead.
"""

from schedulers.all_max import AllMaxFrequency
from schedulers.base import FrequencyScheduler, build_scheduler, check_scheduler_args
from schedulers.envpipe import EnvPipe
from schedulers.perseus_scheduler import Perseus
from schedulers.pipeline import PipelineScheduler
from schedulers.point_solution import PointSolution
from schedulers.profiler import InstructionProfiler
from schedulers.zeus import ZeusGlobal, ZeusPerStage

SCHEDULERS: dict[str, type[FrequencyScheduler]] = {
    "AllMaxFrequency": AllMaxFrequency,
    "EnvPipe": EnvPipe,
    "InstructionProfiler": InstructionProfiler,
    "Perseus": Perseus,
    "PointSolution": PointSolution,
    "ZeusGlobal": ZeusGlobal,
    "ZeusPerStage": ZeusPerStage,
}

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
]
