"""The wire protocol: the models and routes shared by the coordinator and its per-rank client.

Names, fields and semantics follow Zeus's `zeus.optimizer.perseus.common`, rewritten for
pydantic v2; every name is importable from `perseus.protocol`, as in Zeus.

```
perseus.protocol            the routes, the job credential header; Zeus's file helpers
├── limits                  bounds of every measured number, PROTOCOL_VERSION
├── jobs                    registration: PipelineSpec, JobInfo, JobRecord, RankInfo
├── rounds                  a round: FrequencySchedule (+ RoundStatus), ProfilingResult
│                           (+ EnergyWindow, ReplicaFigures)
└── profiles                offline profiles: OfflineProfilingResult, InstructionProfilingResult
```

A job's dumped rounds are lists of these models in JSON files (`perseus.io.model_files`,
under the names `perseus.io.jobdir.JobDir` owns); `save_prof`, `load_prof` and their
siblings keep Zeus's names for them.
"""

from __future__ import annotations

import asyncio
import os

from perseus.domain.kinds import INSTRUCTIONS
from perseus.domain.layout import Leaders, ParallelLayout
from perseus.io.jobdir import JobDir
from perseus.io.model_files import dump_models, load_models
from perseus.protocol.jobs import JobInfo, JobRecord, PipelineSpec, RankInfo
from perseus.protocol.limits import (
    AFTER_WORK_EDGES_S,
    MAX_ENERGY_J,
    MAX_FREQ_MHZ,
    MAX_FREQUENCIES,
    MAX_ITERATIONS,
    MAX_POWER_W,
    MAX_REFRESH_S,
    MAX_REPLICAS,
    MAX_SWITCH_LATENCY_S,
    MAX_TIME_S,
    MAX_WINDOWS,
    PROTOCOL_VERSION,
    SAMPLED_TAIL,
    InstructionKind,
)
from perseus.protocol.profiles import InstructionProfilingResult, OfflineProfilingResult
from perseus.protocol.rounds import (
    MAX_NOTES,
    EnergyWindow,
    FrequencySchedule,
    JobNote,
    JobOutcome,
    ProfilingResult,
    ReplicaFigures,
    RoundStatus,
)

__all__ = [
    "FINISH_URL",
    "GET_SCHEDULE_URL",
    "INFO_URL",
    "INSTRUCTIONS",
    "JOB_TOKEN_HEADER",
    "MAX_ENERGY_J",
    "MAX_FREQUENCIES",
    "MAX_FREQ_MHZ",
    "MAX_ITERATIONS",
    "MAX_NOTES",
    "MAX_POWER_W",
    "MAX_REFRESH_S",
    "MAX_REPLICAS",
    "MAX_SWITCH_LATENCY_S",
    "MAX_TIME_S",
    "MAX_WINDOWS",
    "PROTOCOL_VERSION",
    "REGISTER_JOB_URL",
    "REGISTER_RANK_URL",
    "REPORT_RESULT_URL",
    "SAMPLED_TAIL",
    "AFTER_WORK_EDGES_S",
    "STRAGGLER_URL",
    "EnergyWindow",
    "FrequencySchedule",
    "InstructionKind",
    "InstructionProfilingResult",
    "JobInfo",
    "JobNote",
    "JobOutcome",
    "JobRecord",
    "Leaders",
    "OfflineProfilingResult",
    "ParallelLayout",
    "PipelineSpec",
    "ProfilingResult",
    "RankInfo",
    "ReplicaFigures",
    "RoundStatus",
    "load_prof",
    "load_ranks",
    "load_sched",
    "save_prof",
    "save_ranks",
    "save_sched",
]

GET_SCHEDULE_URL = "/schedule/{job_id}"
REGISTER_JOB_URL = "/register_job"
REGISTER_RANK_URL = "/register_rank/{job_id}"
REPORT_RESULT_URL = "/result/{job_id}"
STRAGGLER_URL = "/straggler/{job_id}"
FINISH_URL = "/finish/{job_id}"
INFO_URL = "/info"

JOB_TOKEN_HEADER = "X-Perseus-Job-Token"
"""The job credential: answered by ``POST /register_job``, required by every route under
the job's id (``/register_rank``, ``/schedule``, ``/result``, ``/finish``; ``/straggler``
and ``GET /jobs/{job_id}`` take it or the coordinator's token)."""


async def save_prof(
    data: list[ProfilingResult], directory: str | os.PathLike[str], schedule_num: int
) -> None:
    """Save a list of `ProfilingResult`s in the designated directory."""
    await asyncio.to_thread(dump_models, JobDir(directory).results(schedule_num), data)


def load_prof(directory: str | os.PathLike[str], schedule_num: int) -> list[ProfilingResult]:
    """Load a list of `ProfilingResult`s saved in the designated directory."""
    return load_models(JobDir(directory).results(schedule_num), ProfilingResult)


async def save_sched(
    data: list[FrequencySchedule], directory: str | os.PathLike[str], schedule_num: int
) -> None:
    """Save a list of `FrequencySchedule`s in the designated directory."""
    await asyncio.to_thread(dump_models, JobDir(directory).schedules(schedule_num), data)


def load_sched(directory: str | os.PathLike[str], schedule_num: int) -> list[FrequencySchedule]:
    """Load a list of `FrequencySchedule`s saved in the designated directory."""
    return load_models(JobDir(directory).schedules(schedule_num), FrequencySchedule)


async def save_ranks(data: list[RankInfo], directory: str | os.PathLike[str]) -> None:
    """Save a list of `RankInfo`s in the designated directory."""
    await asyncio.to_thread(dump_models, JobDir(directory).ranks, data)


def load_ranks(directory: str | os.PathLike[str]) -> list[RankInfo]:
    """Load a list of `RankInfo`s saved in the designated directory."""
    return load_models(JobDir(directory).ranks, RankInfo)
