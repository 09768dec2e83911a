"""The one place where the batch-size optimizer's errors become HTTP statuses and bodies.

Domain errors (`ZeusBSOError`) answer ``{"detail": message, "error": class name}`` with the
status `_STATUS` maps them to, and so do FastAPI's own HTTP errors (an unparseable body); request validation errors answer FastAPI's documented 422
shape (``{"detail": [{"loc", "msg", "type"}, ...]}``) without echoing the input, which may
be NaN or infinite (not JSON) or large. Every route declares these bodies in the OpenAPI
schema through `error_responses`.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from zeus_power.errors import (
    ZeusBSOConfigError,
    ZeusBSOConflictError,
    ZeusBSOError,
    ZeusBSOJobNotFoundError,
    ZeusBSORuntimeError,
    ZeusBSOTrialNotFoundError,
)

__all__ = ["BSOErrorBody", "error_responses", "install_error_handlers", "status_of"]

_STATUS: dict[type[ZeusBSOError], int] = {
    ZeusBSOJobNotFoundError: 404,
    ZeusBSOTrialNotFoundError: 404,
    ZeusBSOConfigError: 409,
    ZeusBSOConflictError: 409,
    ZeusBSORuntimeError: 503,
}

_WHY = {
    400: "A body that cannot be parsed (not text)",
    404: "Unknown job id, or unknown trial of the job",
    409: "Conflict: registered with another config, trial already reported, nothing converged",
    503: "The database failed or is busy; retry",
}

_MAX_REPORTED = 20
"""Validation errors listed in one answer."""


class BSOErrorBody(BaseModel):
    """The body of a domain error."""

    detail: str
    """What went wrong, and the fix where there is one."""
    error: str
    """The error's class name (e.g. ``ZeusBSOTrialNotFoundError``)."""


class GuardBody(BaseModel):
    """The body of the guards' answers (`zeus_power.serving`: 401 token, 413 body size)."""

    detail: str


_GUARDS = {
    401: "The server has a token (ZEUS_BSO_TOKEN) and the request did not present it as "
    "`Authorization: Bearer <token>`",
    413: "The request body is over ZEUS_BSO_MAX_BODY_BYTES (refused unread)",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses=`` of a route that can answer the domain errors `statuses`,
    each an `BSOErrorBody`, and the guards' 401 and 413 (`GuardBody`). (FastAPI declares the
    422 of every route that takes input itself, as ``HTTPValidationError``: the shape
    `install_error_handlers` answers.)"""
    responses: dict[int | str, dict[str, Any]] = {
        status: {"model": GuardBody, "description": why} for status, why in _GUARDS.items()
    }
    for status in statuses:
        responses[status] = {"model": BSOErrorBody, "description": _WHY[status]}
    return responses


def status_of(exc: ZeusBSOError) -> int:
    """The HTTP status of a domain error (400 when none is mapped)."""
    for cls in type(exc).__mro__:
        if cls in _STATUS:
            return _STATUS[cls]  # type: ignore[index]
    return 400


def _json_safe(value: Any) -> Any:
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return str(value)[:200]


def _errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    out = []
    for err in exc.errors()[:_MAX_REPORTED]:
        entry: dict[str, Any] = {
            "loc": [x if isinstance(x, int) else str(x)[:100] for x in err.get("loc", ())],
            "msg": str(err.get("msg", "invalid"))[:500],
            "type": str(err.get("type", "value_error")),
        }
        ctx = err.get("ctx")
        if isinstance(ctx, dict):
            entry["ctx"] = {str(k): _json_safe(v) for k, v in ctx.items()}
        out.append(entry)
    return out


def install_error_handlers(app: FastAPI) -> None:
    """Domain errors → their status; validation errors → a 422 in strict JSON."""

    async def on_bso_error(_request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(
            status_code=status_of(exc) if isinstance(exc, ZeusBSOError) else 500,
            content={"detail": str(exc), "error": type(exc).__name__},
        )

    async def on_validation_error(_request: Request, exc: Exception) -> JSONResponse:
        detail = _errors(exc) if isinstance(exc, RequestValidationError) else str(exc)
        return JSONResponse(status_code=422, content={"detail": detail})

    async def on_http_error(_request: Request, exc: Exception) -> JSONResponse:
        # FastAPI's own errors (an unparseable body, an unknown path): the same body.
        if not isinstance(exc, HTTPException):  # registered for HTTPException only
            raise exc
        return JSONResponse(
            status_code=exc.status_code,
            content={"detail": str(exc.detail), "error": type(exc).__name__},
            headers=exc.headers,
        )

    app.add_exception_handler(ZeusBSOError, on_bso_error)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
