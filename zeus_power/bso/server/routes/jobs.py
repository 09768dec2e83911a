"""Routes of jobs and their trials. Thin: the logic is in `BSOService`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response, status

from zeus_power.bso.models import (
    MAX_SQL_INT,
    JobConfig,
    JobState,
    TrialAssignment,
    TrialRecord,
    TrialResult,
)
from zeus_power.bso.server.deps import ServiceDep
from zeus_power.bso.server.errors import error_responses

__all__ = ["router"]

router = APIRouter(prefix="/jobs", tags=["jobs"])

JobId = Annotated[str, Path(pattern=r"^[A-Za-z0-9_.:+\-]{1,128}$")]
TrialNumber = Annotated[int, Path(ge=1, le=MAX_SQL_INT)]


# Every status a route can answer is declared with its body (schemathesis checks it).
@router.post(
    "",
    response_model=JobState,
    status_code=status.HTTP_201_CREATED,
    responses={
        200: {"model": JobState, "description": "The identical job was registered before"},
        **error_responses(400, 409, 503),
    },
)
def register_job(config: JobConfig, service: ServiceDep, response: Response) -> JobState:
    """Register a job (201), or confirm an identical registration (200); 409 if different."""
    state, created = service.register_job(config)
    if not created:
        response.status_code = status.HTTP_200_OK
    return state


@router.get("/{job_id}", response_model=JobState, responses=error_responses(404, 503))
def get_job(job_id: JobId, service: ServiceDep) -> JobState:
    """The job's config and exploration state."""
    return service.get_job(job_id)


@router.post(
    "/{job_id}/trials",
    response_model=TrialAssignment,
    status_code=status.HTTP_201_CREATED,
    responses=error_responses(404, 409, 503),
)
def next_trial(job_id: JobId, service: ServiceDep) -> TrialAssignment:
    """Hand out the next batch size as a new trial."""
    return service.next_trial(job_id)


@router.get(
    "/{job_id}/trials", response_model=list[TrialRecord], responses=error_responses(404, 503)
)
def list_trials(job_id: JobId, service: ServiceDep) -> list[TrialRecord]:
    """All trials of the job, by trial number."""
    return service.list_trials(job_id)


@router.patch(
    "/{job_id}/trials/{trial_number}",
    response_model=TrialRecord,
    responses=error_responses(400, 404, 409, 503),
)
def report_trial(
    job_id: JobId, trial_number: TrialNumber, result: TrialResult, service: ServiceDep
) -> TrialRecord:
    """Report a trial's energy, time and convergence (once)."""
    return service.report(job_id, trial_number, result)
