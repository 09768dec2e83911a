"""Perseus: remove energy bloat from pipeline-parallel training.

Profile → DAG → frontier solver → plan → scheduler → coordinator → per-rank client → GPU.
"""

from perseus.client import PerseusOptimizer
from perseus.errors import (
    ConfigurationError,
    CoordinatorError,
    JobNotFoundError,
    PerseusError,
    PlanError,
    ProfileError,
    RankError,
    ScheduleError,
    SolverError,
)
from perseus.protocol import (
    FrequencySchedule,
    InstructionProfilingResult,
    JobInfo,
    OfflineProfilingResult,
    ProfilingResult,
    RankInfo,
)
from perseus.settings import PerseusSettings

__all__ = [
    "ConfigurationError",
    "CoordinatorError",
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
]
