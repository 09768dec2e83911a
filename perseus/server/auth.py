"""Who may talk to the coordinator: two roles and a read-only scrape credential.

Checked before a body is read or a route runs (`CoordinatorAuthMiddleware`), whenever the
coordinator has a token; without one (loopback only) nothing is checked, as before.

- **The operator**: the coordinator's token (`PerseusSettings.token`, ``PERSEUS_TOKEN``),
  sent as ``Authorization: Bearer <token>``. It may do everything but act as a job's rank:
  register jobs, ``/info``, ``/jobs``, inspect any job (``GET /jobs/{job_id}``), announce a
  straggler in any job (``POST /straggler/{job_id}``), ``/metrics``, ``/docs``. A job's
  ranks hold it too (they need it to register the job).
- **A job**: its credential, answered by ``POST /register_job`` in the
  ``X-Perseus-Job-Token`` header (`new_job_token`; the job keeps only its SHA-256,
  `JobRecord.token_sha256`, dumped in ``job.json``). It acts on its own job alone, on every
  route under the job's id: ``/register_rank``, ``/schedule``, ``/result``, ``/finish``
  (these need it: the operator's token is not enough, so that one job's ranks never drive
  another's clocks by mistake), ``/straggler`` and ``GET /jobs/{job_id}``. A credential of
  another job, or a wrong one, is refused (403) whatever else the request carries.
- **Scraping**: ``GET /metrics`` also takes the read-only metrics token
  (`PerseusSettings.metrics_token`, ``PERSEUS_METRICS_TOKEN``), which opens nothing else.

``GET /healthz`` needs nothing. A missing or wrong bearer token is 401; a job route without
the right job credential is 403. Neither credential is ever logged, echoed in an error or
shown by ``/info``.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from perseus.protocol import (
    FINISH_URL,
    GET_SCHEDULE_URL,
    JOB_TOKEN_HEADER,
    REGISTER_RANK_URL,
    REPORT_RESULT_URL,
    STRAGGLER_URL,
)
from zeus_power.serving import (
    ASGIApp,
    Receive,
    Scope,
    Send,
    bearer_token,
    header,
    send_json,
    tokens_match,
)

__all__ = [
    "JOB_ROUTE_PREFIXES",
    "OPERATOR_JOB_ROUTES",
    "CoordinatorAuthMiddleware",
    "hash_token",
    "new_job_token",
]

_JOB_DETAIL_PREFIX = "/jobs/"
_METRICS = ("GET", "/metrics")
_OPEN = frozenset({("GET", "/healthz")})

JOB_ROUTE_PREFIXES = (
    *(
        url.split("{job_id}")[0]
        for url in (
            REGISTER_RANK_URL,
            GET_SCHEDULE_URL,
            REPORT_RESULT_URL,
            FINISH_URL,
            STRAGGLER_URL,
        )
    ),
    _JOB_DETAIL_PREFIX,
)
"""Paths ``<prefix><job_id>`` that act on one job: its credential opens them."""

OPERATOR_JOB_ROUTES = frozenset(
    {("POST", STRAGGLER_URL.split("{job_id}")[0]), ("GET", _JOB_DETAIL_PREFIX)}
)
"""(method, prefix) of the job routes the operator's token opens for any job."""

_JOB_HEADER = JOB_TOKEN_HEADER.lower().encode()


def new_job_token() -> str:
    """A fresh job credential (256 random bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def hash_token(token: str | bytes) -> str:
    """The SHA-256 (hex) a job stores instead of its credential."""
    return hashlib.sha256(token.encode() if isinstance(token, str) else token).hexdigest()


def job_route(path: str) -> tuple[str, str] | None:
    """(prefix, job id) of a path under one job (``/result/<job_id>``), else None."""
    for prefix in JOB_ROUTE_PREFIXES:
        if path.startswith(prefix):
            rest = path[len(prefix) :]
            return (prefix, rest) if rest and "/" not in rest else None
    return None


class CoordinatorAuthMiddleware:
    """ASGI middleware: the operator's token, each job's credential, the metrics token
    (see the module docstring).

    Args:
        app: The wrapped ASGI app.
        state: The app's state, whose ``job_manager`` (set by the lifespan) holds the jobs.
        token: The operator's (cluster) token; None turns every check off.
        metrics_token: The read-only credential of ``GET /metrics`` (None: none).
        realm: Named in the 401's ``WWW-Authenticate`` header.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        state: Any,
        token: str | None,
        metrics_token: str | None = None,
        realm: str = "perseus",
    ) -> None:
        self.app = app
        self.state = state
        self._token = token.encode() if token else None
        self._metrics_token = metrics_token.encode() if metrics_token else None
        self._realm = realm

    def __repr__(self) -> str:
        return f"CoordinatorAuthMiddleware(auth={'on' if self._token else 'off'})"

    async def _unauthorized(self, send: Send, given: bytes | None, what: str) -> None:
        problem = "missing" if given is None else "wrong"
        await send_json(
            send,
            401,
            {
                "detail": f"Unauthorized: the bearer token is {problem}; send "
                f"'Authorization: Bearer <token>' with {what}"
            },
            www_authenticate=f'Bearer realm="{self._realm}"',
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._token is None or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        if (method, path) in _OPEN:
            await self.app(scope, receive, send)
            return
        given = bearer_token(scope)
        operator = given is not None and tokens_match(given, self._token)
        if (method, path) == _METRICS:
            scraper = (
                given is not None
                and self._metrics_token is not None
                and tokens_match(given, self._metrics_token)
            )
            if operator or scraper:
                await self.app(scope, receive, send)
            else:
                await self._unauthorized(
                    send, given, "the coordinator's token or its metrics token"
                )
            return
        if given is not None and not operator:
            await self._unauthorized(send, given, "the coordinator's token")
            return
        route = job_route(path)
        manager = getattr(self.state, "job_manager", None)
        job = manager.jobs.get(route[1]) if route is not None and manager is not None else None
        if route is None or job is None:  # not a known job's route: the operator's
            if operator:
                await self.app(scope, receive, send)
            else:
                await self._unauthorized(send, given, "the coordinator's token")
            return
        prefix, job_id = route
        credential = header(scope, _JOB_HEADER)
        expected = job.info.token_sha256
        if credential is not None:
            if expected is not None and tokens_match(hash_token(credential), expected):
                await self.app(scope, receive, send)
                return
            why = (
                "it was registered without a credential (an old dump); register it again"
                if expected is None
                else f"this {JOB_TOKEN_HEADER} is not its credential"
            )
        elif operator and (method, prefix) in OPERATOR_JOB_ROUTES:
            await self.app(scope, receive, send)
            return
        elif not operator:
            await self._unauthorized(
                send, given, "the coordinator's token, or send the job's " + JOB_TOKEN_HEADER
            )
            return
        else:
            why = (
                f"send the {JOB_TOKEN_HEADER} header that POST /register_job answered (the "
                "coordinator's token does not act as a job's rank)"
            )
        await send_json(
            send, 403, {"detail": f"Forbidden: not a credential of job {job_id}: {why}"}
        )
