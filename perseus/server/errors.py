"""Coordinator errors and the one place where errors become HTTP statuses.

Server-side branches of the Perseus exception tree (`perseus.errors`):

```
PerseusError
├── CoordinatorError (status_code set → that status)
│   ├── JobNotFoundError            404  unknown (or evicted) job id
│   ├── JobFailedError              409  the job failed earlier (the status of its failure)
│   ├── RoundTimeoutError           504  not every rank asked for its schedule in time
│   └── SchedulerFailedError        400  scheduler rejected its input (PerseusError/ValueError)
│                                   500  scheduler crashed (anything else)
├── ConfigurationError
│   └── InvalidJobError             422  a job description the coordinator cannot accept
└── RankError
    ├── InvalidRankError            422  rank/dp/pp/tp out of range, duplicate coordinates
    └── RankConflictError           409  the same rank registered twice, result reported twice
```

Every error body is ``{"detail": "<message>"}``; a traceback never reaches a client.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from perseus.errors import (
    ConfigurationError,
    CoordinatorError,
    JobNotFoundError,
    PerseusError,
    RankError,
)

__all__ = [
    "InvalidJobError",
    "InvalidRankError",
    "JobFailedError",
    "RankConflictError",
    "RoundTimeoutError",
    "SchedulerFailedError",
    "install_error_handlers",
    "status_of",
]

logger = logging.getLogger(__name__)


class InvalidJobError(ConfigurationError):
    """A job description the coordinator cannot accept (beyond the model's validation)."""


class InvalidRankError(RankError):
    """A rank (or its dp/pp/tp coordinates) does not fit the job."""


class RankConflictError(RankError):
    """A rank did something twice that may happen once (register, report a round)."""


class JobFailedError(CoordinatorError):
    """The job failed earlier; every later call gets the failure's message."""


class RoundTimeoutError(CoordinatorError):
    """The round's barrier did not complete within the round timeout."""


class SchedulerFailedError(CoordinatorError):
    """The job's scheduler raised; `status_code` is 400 (bad input) or 500 (crash)."""


def scheduler_error_status(exc: BaseException) -> int:
    """400 for errors about bad input (Perseus errors, ValueError), 500 otherwise."""
    return 400 if isinstance(exc, PerseusError | ValueError) else 500


def status_of(exc: BaseException) -> int:
    """The HTTP status for an error raised while serving a request."""
    if isinstance(exc, CoordinatorError) and exc.status_code is not None:
        return exc.status_code
    match exc:
        case JobNotFoundError():
            return 404
        case InvalidRankError() | InvalidJobError():
            return 422
        case RankConflictError() | JobFailedError():
            return 409
        case RoundTimeoutError():
            return 504
        case PerseusError() | ValueError():
            return 400
        case _:
            return 500


def _message(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or "body"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "Invalid request: " + "; ".join(parts)


def install_error_handlers(app: FastAPI) -> None:
    """Map domain errors, validation errors and crashes to ``{"detail": message}`` bodies."""

    async def on_perseus_error(request: Request, exc: Exception) -> JSONResponse:
        status = status_of(exc)
        if status == 500:
            logger.error("%s %s failed: %s", request.method, request.url.path, exc)
        return JSONResponse({"detail": _message(exc)}, status_code=status)

    async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return JSONResponse({"detail": _validation_message(exc)}, status_code=422)

    async def on_crash(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("%s %s crashed", request.method, request.url.path)
        return JSONResponse(
            {"detail": f"Internal coordinator error: {type(exc).__name__}: {_message(exc)}"},
            status_code=500,
        )

    app.add_exception_handler(PerseusError, on_perseus_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(Exception, on_crash)
