"""The coordinator's HTTP routes (thin: the job manager holds the logic).

The protocol (wire models in `perseus.protocol`): ``GET /info``,
``POST /register_job``, ``POST /register_rank/{job_id}``, ``GET /schedule/{job_id}?rank=R``,
``POST /result/{job_id}``, ``POST /straggler/{job_id}``.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, Field

from perseus.protocol import (
    GET_SCHEDULE_URL,
    INFO_URL,
    REGISTER_JOB_URL,
    REGISTER_RANK_URL,
    REPORT_RESULT_URL,
    STRAGGLER_URL,
    FrequencySchedule,
    JobInfo,
    ProfilingResult,
    RankInfo,
)
from perseus.server.job_manager import JobManager

__all__ = ["StragglerReport", "router"]


class StragglerReport(BaseModel):
    """Body of ``POST /straggler/{job_id}``.

    Attributes:
        dp_rank: The data-parallel pipeline that is slow.
        slowdown: Its iteration time as a factor of its normal time (>= 1.0; 1.0 = recovered).
    """

    dp_rank: int = Field(ge=0)
    slowdown: float = Field(ge=1.0, allow_inf_nan=False)


async def get_job_manager(request: Request) -> JobManager:
    return request.app.state.job_manager  # type: ignore[no-any-return]


JobManagerDep = Annotated[JobManager, Depends(get_job_manager)]

router = APIRouter()


def _version() -> str:
    try:
        return version("perseus-energy")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0+unknown"


@router.get(INFO_URL)
async def info(manager: JobManagerDep) -> dict[str, Any]:
    """The scheduler this coordinator runs, its arguments, and the Perseus version."""
    return {
        "scheduler": manager.scheduler_cls.__name__,
        "scheduler_args": manager.settings.scheduler_args,
        "version": _version(),
    }


@router.post(REGISTER_JOB_URL)
async def register_job(job_info: JobInfo, manager: JobManagerDep) -> str:
    """Register a job (``job_id`` empty); returns the new job id."""
    return await manager.create_job(job_info)


@router.post(REGISTER_RANK_URL)
async def register_rank(job_id: str, rank_info: RankInfo, manager: JobManagerDep) -> None:
    """Register one rank; the last one starts the job's scheduler."""
    await manager.get(job_id).register_rank(rank_info)


@router.get(GET_SCHEDULE_URL)
async def get_schedule(
    job_id: str, rank: Annotated[int, Query(ge=0)], manager: JobManagerDep
) -> FrequencySchedule:
    """Long-poll: returns once every rank of the job has asked (a round's barrier)."""
    return await manager.get(job_id).get_schedule(rank)


@router.post(REPORT_RESULT_URL)
async def report_result(job_id: str, result: ProfilingResult, manager: JobManagerDep) -> None:
    """Report the results of the rank's last schedule."""
    await manager.get(job_id).report_result(result)


@router.post(STRAGGLER_URL)
async def announce_straggler(job_id: str, report: StragglerReport, manager: JobManagerDep) -> None:
    """Announce that a data-parallel pipeline runs slow (slowdown 1.0: it recovered)."""
    await manager.get(job_id).announce_straggler(report.dp_rank, report.slowdown)
