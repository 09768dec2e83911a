"""httpx's failures and a coordinator's error answers, as `perseus.errors` (in one place).

`CoordinatorClient` sends each attempt through httpx; what goes wrong becomes one of
ours here, ``raise ... from`` the httpx error:

- the coordinator went away (connection refused, reset or closed mid-answer, a connect
  timeout, a proxy's 502, 503 or 504): `CoordinatorUnreachableError`, which the client
  retries for ``PERSEUS_RECONNECT_S``;
- a read timeout, any other transport error, an answer that is not JSON, any other
  error status: `CoordinatorRequestError` (final), carrying the status and the
  coordinator's ``detail``;
- 404: `JobNotFoundError` (retried only after an outage: the restarted coordinator may
  not have restored the job yet).

The coordinator's own 504 (a JSON ``detail``: a round timed out, the job failed) is final.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from perseus.errors import (
    CoordinatorError,
    CoordinatorRequestError,
    CoordinatorUnreachableError,
    JobNotFoundError,
)

__all__ = ["answer_error", "decode_answer", "transport_error"]

_RETRY_STATUS = frozenset({502, 503, 504})
_CONNECTION_ERRORS = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.ReadError,
    httpx.WriteError,
    httpx.RemoteProtocolError,
)
"""Transport errors that mean the coordinator went away (not that it is slow)."""


def transport_error(
    exc: httpx.HTTPError,
    *,
    server_url: str,
    method: str,
    path: str,
    read_s: float,
    connect_s: float,
) -> CoordinatorError:
    """The error for a request to `server_url` + `path` that httpx could not complete."""
    url = f"{server_url}{path}"
    if isinstance(exc, httpx.ConnectError):
        return CoordinatorUnreachableError(
            f"Cannot reach the Perseus coordinator at {server_url}: {exc}. "
            "Is it running (perseus serve) and is the URL right?",
            url=url,
        )
    if isinstance(exc, httpx.ConnectTimeout):
        return CoordinatorUnreachableError(
            f"The Perseus coordinator at {server_url} did not answer {method} {path} within "
            f"{connect_s:g} s ({type(exc).__name__}). Is it running (perseus serve) and is "
            "the URL right?",
            url=url,
        )
    if isinstance(exc, httpx.TimeoutException):
        return CoordinatorRequestError(
            f"The Perseus coordinator at {server_url} did not answer {method} {path} within "
            f"{read_s:g} s ({type(exc).__name__})",
            url=url,
        )
    kind = (
        CoordinatorUnreachableError
        if isinstance(exc, _CONNECTION_ERRORS)
        else CoordinatorRequestError
    )
    return kind(f"{method} {url} failed: {type(exc).__name__}: {exc}", url=url)


def decode_answer(response: httpx.Response, url: str) -> Any:
    """The JSON of a successful answer; `CoordinatorRequestError` if it is not JSON."""
    try:
        return response.json()
    except ValueError as exc:
        raise CoordinatorRequestError(
            f"The Perseus coordinator at {url} answered {response.status_code} with "
            f"a body that is not JSON: {response.text[:200]!r}",
            url=url,
            status_code=response.status_code,
        ) from exc


def answer_error(response: httpx.Response, url: str) -> CoordinatorError:
    """The error for an error answer, quoting the coordinator's ``detail``."""
    coordinator_said = False
    try:
        detail = response.json()["detail"]
        coordinator_said = True
    except (ValueError, TypeError, KeyError):
        detail = response.text[:500]
    if not isinstance(detail, str):
        detail = json.dumps(detail)
    status = response.status_code
    answered: type[CoordinatorError] = CoordinatorRequestError
    if status == 404:
        answered = JobNotFoundError
    elif status in _RETRY_STATUS and not (status == 504 and coordinator_said):
        answered = CoordinatorUnreachableError  # a proxy's: the coordinator is away
    return answered(
        f"The Perseus coordinator at {url} answered {status} {response.reason_phrase}: {detail}",
        url=url,
        status_code=status,
    )
