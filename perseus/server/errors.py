"""The one place where errors become HTTP statuses and ``{"detail": message}`` bodies.

Each `perseus.errors` class carries its status (`PerseusError.status`, drawn in that
module's tree); anything else is a 400 when it is a ``ValueError`` (bad input) and a 500
otherwise. Every error body is ``{"detail": "<message>"}``; a traceback never reaches a
client.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from perseus.errors import PerseusError

__all__ = ["install_error_handlers", "scheduler_error_status", "status_of"]

logger = logging.getLogger(__name__)


def status_of(exc: BaseException) -> int:
    """The HTTP status for an error raised while serving a request."""
    if isinstance(exc, PerseusError):
        return exc.status
    return 400 if isinstance(exc, ValueError) else 500


def scheduler_error_status(exc: BaseException) -> int:
    """A scheduler's error: 400 when it rejected its input (a Perseus error or
    ValueError), 500 when it crashed."""
    return 400 if isinstance(exc, PerseusError | ValueError) else 500


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
