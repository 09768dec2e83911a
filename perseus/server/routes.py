"""The coordinator's HTTP routes (thin: the job manager holds the logic).

The protocol (wire models in `perseus.protocol`): ``GET /info``,
``POST /register_job``, ``POST /register_rank/{job_id}``, ``GET /schedule/{job_id}?rank=R``,
``POST /result/{job_id}``, ``POST /straggler/{job_id}``, ``POST /finish/{job_id}``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, Field

from perseus.planning.report import EnergyReport
from perseus.protocol import (
    FINISH_URL,
    GET_SCHEDULE_URL,
    INFO_URL,
    JOB_TOKEN_HEADER,
    REGISTER_JOB_URL,
    REGISTER_RANK_URL,
    REPORT_RESULT_URL,
    STRAGGLER_URL,
    FrequencySchedule,
    JobInfo,
    JobOutcome,
    ProfilingResult,
    RankInfo,
)
from perseus.server.auth import hash_token, new_job_token
from perseus.server.errors import error_responses
from perseus.server.job_manager import JobManager
from perseus.server.metrics import package_version

__all__ = ["MAX_STRAGGLER_SLOWDOWN", "FinishedJob", "StragglerReport", "router"]

MAX_STRAGGLER_SLOWDOWN = 100.0
"""A pipeline 100× slower than normal has failed, not straggled: larger factors are refused."""


class StragglerReport(BaseModel):
    """Body of ``POST /straggler/{job_id}``.

    Attributes:
        dp_rank: The data-parallel pipeline that is slow.
        slowdown: Its iteration time as a factor of its normal time (1.0 to
            `MAX_STRAGGLER_SLOWDOWN`; 1.0 = recovered).
    """

    dp_rank: int = Field(ge=0)
    slowdown: float = Field(ge=1.0, le=MAX_STRAGGLER_SLOWDOWN, allow_inf_nan=False)


class FinishedJob(JobOutcome):
    """Answer of ``POST /finish/{job_id}``: what the job did, for its rank 0 to log, and
    the whole energy report."""

    energy: EnergyReport


async def get_job_manager(request: Request) -> JobManager:
    return request.app.state.job_manager  # type: ignore[no-any-return]


JobManagerDep = Annotated[JobManager, Depends(get_job_manager)]

router = APIRouter()


_PLAIN_WORD = re.compile(r"[A-Za-z0-9_+-]{1,64}")


def _public_args(args: dict[str, Any]) -> dict[str, Any]:
    """Scheduler arguments as ``/info`` shows them: numbers, flags and plain words (a
    schedule's name) as they are, anything else (a file path, a list) ``"<redacted>"``, so
    that they reveal nothing of the coordinator's file system."""

    def public(value: Any) -> Any:
        if value is None or isinstance(value, bool | int | float):
            return value
        if isinstance(value, str) and _PLAIN_WORD.fullmatch(value):
            return value
        return "<redacted>"

    return {name: public(value) for name, value in args.items()}


# Every status a route can answer, each with its body (`ErrorBody`), so that the OpenAPI
# schema is the truth (checked by schemathesis in tests/integration/server/test_server_openapi.py).
# A job that failed answers every later call with its failure's status (400, 409, 422, 500);
# a body that is not even text is a 400 (FastAPI's "There was an error parsing the body").
_JOB = (400, 401, 403, 404, 409, 413, 422, 500)


@router.get(INFO_URL, responses=error_responses(401, 500))
async def info(manager: JobManagerDep) -> dict[str, Any]:
    """The scheduler this coordinator runs, its arguments, and the Perseus version."""
    return {
        "scheduler": manager.scheduler_cls.__name__,
        "scheduler_args": _public_args(manager.settings.scheduler_args),
        "version": package_version(),
    }


@router.post(REGISTER_JOB_URL, responses=error_responses(400, 401, 413, 422, 500, 503))
async def register_job(job_info: JobInfo, manager: JobManagerDep, response: Response) -> str:
    """Register a job (``job_id`` empty); returns the new job id, and its credential in the
    ``X-Perseus-Job-Token`` header (every route under the job id needs it)."""
    token = new_job_token()
    job_id = await manager.create_job(job_info, token_sha256=hash_token(token))
    response.headers[JOB_TOKEN_HEADER] = token
    return job_id


@router.post(REGISTER_RANK_URL, responses=error_responses(*_JOB))
async def register_rank(job_id: str, rank_info: RankInfo, manager: JobManagerDep) -> None:
    """Register one rank; the last one starts the job's scheduler."""
    await manager.get(job_id).register_rank(rank_info)


@router.get(GET_SCHEDULE_URL, responses=error_responses(*_JOB, 503, 504))
async def get_schedule(
    job_id: str, rank: Annotated[int, Query(ge=0)], manager: JobManagerDep
) -> FrequencySchedule:
    """Long-poll: returns once every rank of the job has asked (a round's barrier)."""
    return await manager.get(job_id).get_schedule(rank)


@router.post(REPORT_RESULT_URL, responses=error_responses(*_JOB))
async def report_result(job_id: str, result: ProfilingResult, manager: JobManagerDep) -> None:
    """Report the results of the rank's last schedule."""
    await manager.get(job_id).report_result(result)


@router.post(STRAGGLER_URL, responses=error_responses(*_JOB))
async def announce_straggler(job_id: str, report: StragglerReport, manager: JobManagerDep) -> None:
    """Announce that a data-parallel pipeline runs slow (slowdown 1.0: it recovered)."""
    await manager.get(job_id).announce_straggler(report.dp_rank, report.slowdown)


@router.post(FINISH_URL, responses=error_responses(*_JOB))
async def finish_job(job_id: str, manager: JobManagerDep) -> FinishedJob:
    """The job ended normally: its rank 0 calls this once, after every rank has closed.
    The job runs no more rounds and is listed as ``finished``; the results of its last
    round are still taken. Idempotent."""
    job = manager.get(job_id)
    job.finish()
    stats = job.stats
    report = stats.report()
    return FinishedJob(
        job_id=job.job_id,
        rounds=stats.rounds_completed,
        iterations_measured=stats.iterations_measured,
        energy_j=stats.energy_j_total,
        measured_saving=report.measured_saving,
        measured_slowdown=report.measured_slowdown,
        predicted_saving=report.predicted_saving,
        predicted_slowdown=report.predicted_slowdown,
        energy=report,
    )
