"""Who may talk to the coordinator: the cluster token and each job's credential.

Two credentials, both off the request path's hot work (checked before a body is read):

- the coordinator's token (`PerseusSettings.token`, ``PERSEUS_TOKEN``): every request but
  ``GET /healthz`` presents ``Authorization: Bearer <token>``, else 401
  (`zeus_power.serving.BearerAuthMiddleware`);
- a job's credential: ``POST /register_job`` answers a fresh random one in the
  ``X-Perseus-Job-Token`` header (`new_job_token`), the job keeps only its SHA-256
  (`JobRecord.token_sha256`, dumped in ``job.json``), and every route under the job's id
  needs it, else 403 (`JobTokenMiddleware`). Checked whenever the coordinator has a token:
  without one (loopback only) nothing is checked, as before.

Neither credential is ever logged, echoed in an error or shown by ``/info``.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from perseus.protocol import (
    GET_SCHEDULE_URL,
    JOB_TOKEN_HEADER,
    REGISTER_RANK_URL,
    REPORT_RESULT_URL,
    STRAGGLER_URL,
)
from zeus_power.serving import ASGIApp, Receive, Scope, Send, header, send_json, tokens_match

__all__ = ["JOB_ROUTE_PREFIXES", "JobTokenMiddleware", "hash_token", "new_job_token"]

JOB_ROUTE_PREFIXES = tuple(
    url.split("{job_id}")[0]
    for url in (REGISTER_RANK_URL, GET_SCHEDULE_URL, REPORT_RESULT_URL, STRAGGLER_URL)
)
"""Paths ``<prefix><job_id>`` that act on a job and need its credential."""

_JOB_HEADER = JOB_TOKEN_HEADER.lower().encode()


def new_job_token() -> str:
    """A fresh job credential (256 random bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def hash_token(token: str | bytes) -> str:
    """The SHA-256 (hex) a job stores instead of its credential."""
    return hashlib.sha256(token.encode() if isinstance(token, str) else token).hexdigest()


def job_id_of(path: str) -> str | None:
    """The job id of a path under a job (``/result/<job_id>``), else None."""
    for prefix in JOB_ROUTE_PREFIXES:
        if path.startswith(prefix):
            rest = path[len(prefix) :]
            return rest if rest and "/" not in rest else None
    return None


class JobTokenMiddleware:
    """ASGI middleware: 403 for a request under a known job id without its credential.

    An unknown job id passes through (the route answers 404, as before). Jobs restored from
    a dump written before credentials existed have no hash and are refused (403).

    Args:
        app: The wrapped ASGI app.
        state: The app's state, whose ``job_manager`` (set by the lifespan) holds the jobs.
        enabled: False lets every request through (a coordinator without a token).
    """

    def __init__(self, app: ASGIApp, *, state: Any, enabled: bool) -> None:
        self.app = app
        self.state = state
        self.enabled = enabled

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.enabled and scope["type"] == "http":
            job_id = job_id_of(scope["path"])
            manager = getattr(self.state, "job_manager", None)
            job = manager.jobs.get(job_id) if job_id is not None and manager else None
            if job is not None:
                expected = job.info.token_sha256
                given = header(scope, _JOB_HEADER)
                if (
                    expected is None
                    or given is None
                    or not tokens_match(hash_token(given), expected)
                ):
                    why = (
                        "it was registered without a credential (an old dump); register it again"
                        if expected is None
                        else f"send the {JOB_TOKEN_HEADER} header that POST /register_job "
                        "answered" + (" (this one is wrong)" if given is not None else "")
                    )
                    await send_json(
                        send, 403, {"detail": f"Forbidden: not a credential of job {job_id}: {why}"}
                    )
                    return
        await self.app(scope, receive, send)
