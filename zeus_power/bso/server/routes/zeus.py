"""Zeus 0.16's batch-size optimizer routes, under ``/zeus``: a thin adapter over `BSOService`.

A Zeus user points ``BatchSizeOptimizer(monitor, server_url="http://HOST:PORT/zeus", job)``
at this server and changes nothing else. Same database, same policy and the same trial
logic as our own routes (`zeus_power.bso.service`); only the wire shapes are Zeus's
(`zeus_power.bso.zeus_models`):

- ``POST /zeus/jobs``: register (201) or confirm (200) a job; Zeus's client sends it with no
  Content-Type, which these routes read as JSON;
- ``GET /zeus/jobs/batch_size?job_id=``: the next trial;
- ``POST /zeus/report``: one epoch; the answer says whether to stop and whether the trial
  converged (`zeus_power.bso.policy.epoch_verdict`), and a stop records the trial's result;
- ``PATCH /zeus/trials``: the trial's end (Zeus's client sends it when its process exits);
  a trial still waiting for its result fails.

Zeus's client sends no credentials: with ``ZEUS_BSO_TOKEN`` set, these routes answer 401
like every other, so a server for Zeus's clients runs without a token, on loopback (or with
``--insecure`` on a trusted network).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response, status
from fastapi.routing import APIRoute

from zeus_power.bso.models import TrialRecord
from zeus_power.bso.server.deps import ServiceDep
from zeus_power.bso.server.errors import error_responses
from zeus_power.bso.zeus_models import (
    JOB_ID_PATTERN,
    ZeusCreatedJob,
    ZeusJobSpec,
    ZeusReportResponse,
    ZeusTrainingResult,
    ZeusTrialId,
)

__all__ = ["router"]


class _JSONByDefault(APIRoute):
    """A route that reads a body sent without a Content-Type as JSON (Zeus's client sends
    its bodies as ``content=model.json()``, which sets none)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            if "content-type" not in request.headers:
                scope = dict(request.scope)
                scope["headers"] = [
                    *request.scope["headers"],
                    (b"content-type", b"application/json"),
                ]
                request = Request(scope, request.receive)
            return await handler(request)

        return route


router = APIRouter(prefix="/zeus", tags=["zeus"], route_class=_JSONByDefault)

JobIdQuery = Annotated[str, Query(pattern=JOB_ID_PATTERN)]


@router.post(
    "/jobs",
    response_model=ZeusCreatedJob,
    status_code=status.HTTP_201_CREATED,
    responses={
        200: {"model": ZeusCreatedJob, "description": "The identical job was registered before"},
        **error_responses(400, 409, 503),
    },
)
def register_job(spec: ZeusJobSpec, service: ServiceDep, response: Response) -> ZeusCreatedJob:
    """Register a job (201), or confirm an identical registration (200); 409 if different.
    Without a ``job_id``, the server names the job ``<job_id_prefix>-<8 hex digits>``."""
    job_id = spec.job_id or f"{spec.job_id_prefix}-{secrets.token_hex(4)}"
    state, created = service.register_job(spec.to_config(job_id))
    if not created:
        response.status_code = status.HTTP_200_OK
    return ZeusCreatedJob.of(state.config, spec.job_id_prefix)


@router.get(
    "/jobs/batch_size", response_model=ZeusTrialId, responses=error_responses(404, 409, 503)
)
def next_batch_size(job_id: JobIdQuery, service: ServiceDep) -> ZeusTrialId:
    """Hand out the job's next batch size as a new trial."""
    trial = service.next_trial(job_id)
    return ZeusTrialId(
        job_id=trial.job_id, batch_size=trial.batch_size, trial_number=trial.trial_number
    )


@router.post("/report", response_model=ZeusReportResponse, responses=error_responses(400, 404, 503))
def report(result: ZeusTrainingResult, service: ServiceDep) -> ZeusReportResponse:
    """One epoch of a trial: go on, or stop (converged or not; the result is recorded)."""
    verdict = service.report_epoch(
        result.job_id,
        result.trial_number,
        batch_size=result.batch_size,
        epochs=result.current_epoch,
        metric=result.metric,
        time_s=result.time,
        energy_j=result.energy,
    )
    return ZeusReportResponse(
        stop_train=verdict.stop, converged=verdict.converged, message=verdict.reason
    )


@router.patch("/trials", response_model=TrialRecord, responses=error_responses(400, 404, 503))
def end_trial(trial: ZeusTrialId, service: ServiceDep) -> TrialRecord:
    """End a trial; one still waiting for its result fails. Answers the trial as stored."""
    return service.end_trial(trial.job_id, trial.trial_number, batch_size=trial.batch_size)
