"""The one place where errors become HTTP statuses and ``{"detail": message}`` bodies.

The `perseus.errors` classes know nothing of HTTP; `status_of` maps them:

```
JobError               InvalidJobError 422, UnknownJobError 404, CoordinatorBusyError 503,
                       RoundTimeoutError 504 (to the ranks waiting in that round),
                       SchedulerFailedError: its cause's (`scheduler_error_status`),
                       JobStateError 409, or its cause's status when the job failed
                       earlier (a round timeout answers 409 afterwards)
RankError              InvalidRankError 422, InvalidResultError 422, RankConflictError 409,
                       any other 400
CoordinatorError       (client side; never raised by the coordinator) its `status_code`
other PerseusError     400
ValueError             400 (bad input)
anything else          500
```

Every error body is ``{"detail": "<message>"}``; a traceback never reaches a client.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from perseus.errors import (
    CoordinatorBusyError,
    CoordinatorError,
    InvalidJobError,
    InvalidRankError,
    InvalidResultError,
    JobStateError,
    PerseusError,
    RankConflictError,
    RoundTimeoutError,
    SchedulerFailedError,
    UnknownJobError,
)

__all__ = [
    "ErrorBody",
    "error_responses",
    "install_error_handlers",
    "scheduler_error_status",
    "status_of",
]

logger = logging.getLogger(__name__)


_STATUS: tuple[tuple[type[PerseusError], int], ...] = (
    (InvalidJobError, 422),
    (UnknownJobError, 404),
    (CoordinatorBusyError, 503),
    (RoundTimeoutError, 504),
    (InvalidRankError, 422),
    (InvalidResultError, 422),
    (RankConflictError, 409),
)
"""Fixed statuses, by class (the first match wins)."""


def status_of(exc: BaseException) -> int:
    """The HTTP status for an error raised while serving a request (module docstring)."""
    if isinstance(exc, JobStateError):
        if exc.cause is None or isinstance(exc.cause, RoundTimeoutError):
            return 409
        return status_of(exc.cause)
    if isinstance(exc, SchedulerFailedError):
        return 500 if exc.cause is None else scheduler_error_status(exc.cause)
    if isinstance(exc, CoordinatorError):
        return exc.status_code if exc.status_code is not None else 502
    for cls, status in _STATUS:
        if isinstance(exc, cls):
            return status
    return 400 if isinstance(exc, PerseusError | ValueError) else 500


def scheduler_error_status(exc: BaseException) -> int:
    """A scheduler's error: 400 when it rejected its input (a Perseus error or
    ValueError), 422 when it met numbers it cannot compute with (an `ArithmeticError`:
    overflow, division by zero), 500 when it crashed."""
    if isinstance(exc, PerseusError | ValueError):
        return 400
    return 422 if isinstance(exc, ArithmeticError) else 500


class ErrorBody(BaseModel):
    """The body of every error answer (4xx and 5xx), validation errors (422) included."""

    detail: str
    """What went wrong, naming the offending field or value, and the fix where there is one."""


_WHY: dict[int, str] = {
    400: "Bad input: a body that cannot be parsed, input the job's scheduler refused, or "
    "the job failed on such input earlier",
    401: "The coordinator has a token (PERSEUS_TOKEN) and the request did not present it "
    "as `Authorization: Bearer <token>`",
    403: "The request under a job id did not present that job's credential "
    "(`X-Perseus-Job-Token`, answered by POST /register_job)",
    404: "Unknown (or evicted) job id",
    409: "Conflict: the job failed earlier, or the rank did twice what it may do once",
    413: "The request body is over PERSEUS_MAX_BODY_BYTES (refused unread)",
    422: "Invalid request: a field out of range or malformed (the message names it)",
    500: "Internal coordinator error (a bug: please report it)",
    503: "The coordinator is shutting down, or holds PERSEUS_MAX_JOBS live jobs",
    504: "The round's barrier timed out: not every rank asked for its schedule in time",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses=`` of a route that can answer `statuses`: each an
    `ErrorBody` with the status's meaning."""
    return {status: {"model": ErrorBody, "description": _WHY[status]} for status in statuses}


def _message(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


_MAX_REPORTED = 5
"""Validation errors named in one message (a list of a million NaNs is a million errors)."""


def _validation_message(exc: RequestValidationError) -> str:
    errors = exc.errors()
    parts = []
    for err in errors[:_MAX_REPORTED]:
        loc = ".".join(str(x)[:100] for x in err.get("loc", ()) if x != "body") or "body"
        parts.append(f"{loc}: {str(err.get('msg', 'invalid'))[:500]}")
    if len(errors) > _MAX_REPORTED:
        parts.append(f"... and {len(errors) - _MAX_REPORTED} more")
    return "Invalid request: " + "; ".join(parts)


def install_error_handlers(app: FastAPI) -> None:
    """Map domain errors, validation errors and crashes to ``{"detail": message}`` bodies."""

    async def on_perseus_error(request: Request, exc: Exception) -> JSONResponse:
        status = status_of(exc)
        if status == 500:
            logger.error("%s %s failed: %s", request.method, request.url.path, exc)
        return JSONResponse({"detail": _message(exc)}, status_code=status)

    async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
        message = (
            _validation_message(exc) if isinstance(exc, RequestValidationError) else _message(exc)
        )
        job_id = request.path_params.get("job_id")
        if isinstance(job_id, str) and job_id:
            message += f" (job {job_id[:200]}; nothing was changed)"
        return JSONResponse({"detail": message}, status_code=422)

    async def on_crash(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("%s %s crashed", request.method, request.url.path)
        return JSONResponse(
            {"detail": f"Internal coordinator error: {type(exc).__name__}: {_message(exc)}"},
            status_code=500,
        )

    app.add_exception_handler(PerseusError, on_perseus_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(Exception, on_crash)
