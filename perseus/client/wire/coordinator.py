"""The coordinator's HTTP API as one rank uses it.

`CoordinatorClient` speaks the routes of `perseus.protocol` and turns every failure into
the `perseus.errors` tree (`perseus.client.wire.translate`, which says which): a
`CoordinatorUnreachableError` when the coordinator went away, a `JobNotFoundError` (404),
else a `CoordinatorRequestError` naming the URL and carrying the status code and the
coordinator's ``detail``. The httpx client is injectable (`transport=` or `client=`), so tests can talk to an in-process app.

Reconnection: a coordinator that restarts (``kill -9`` and a restart on the same dump
dir, a rolling upgrade) is waited for. A request that meets a connection error (refused,
reset, closed mid-answer), a 502, a 503 (a proxy's, or the coordinator shutting down), a
504 from a proxy (the coordinator's own 504, a JSON ``detail``, says a round timed out and
the job failed: final), or, once such an outage has been seen, a 404
"job unknown", is sent again with capped exponential backoff (0.1 s doubling to 5 s, with
full jitter so thousands of ranks do not reconnect in step) until `reconnect_s` (default
``PERSEUS_RECONNECT_S``, else 120 s; 0 turns retrying off) has passed since the first
failure; then the last error is raised as before, saying how long it retried. A read
timeout is not retried (the request already waited its whole timeout), nor is any other
status. A restarted coordinator restores its jobs before it accepts a connection, so a 404
after an outage means the job was not restored (evicted, failed, or a dump it refused):
the rank fails when the window ends. Retried requests are safe to repeat: the coordinator
accepts a rank's identical registration or result again.

The long window is for a job that exists. A job's first contact (`register_job`) retries for
`FIRST_CONTACT_S` (5 s) at most, each attempt connecting for at most
`FIRST_CONNECT_TIMEOUT_S`, so that a wrong URL or a coordinator that is not running fails
within 10 s, naming the URL, instead of a silent wait.
"""

from __future__ import annotations

import json
import logging
import random
import time
from types import TracebackType
from typing import Any

import httpx
from pydantic import ValidationError

from perseus.client.lifecycle import close_on_exit
from perseus.client.settings import DEFAULT_RECONNECT_S, ClientSettings
from perseus.client.wire.translate import answer_error, decode_answer, transport_error
from perseus.errors import (
    ConfigurationError,
    CoordinatorError,
    CoordinatorRequestError,
    JobNotFoundError,
)
from perseus.protocol import (
    FINISH_URL,
    GET_SCHEDULE_URL,
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

__all__ = [
    "DEFAULT_RECONNECT_S",
    "FIRST_CONTACT_S",
    "RECONNECT_ENV",
    "CoordinatorClient",
    "check_server_url",
    "reconnect_window_s",
]

logger = logging.getLogger(__name__)

RECONNECT_ENV = "PERSEUS_RECONNECT_S"
FIRST_CONTACT_S = 5.0
"""How long registering a job retries an unreachable coordinator (its first contact)."""
FIRST_CONNECT_TIMEOUT_S = 3.0
"""The connect timeout of each attempt of a first contact."""
_BACKOFF_FIRST_S = 0.1
_BACKOFF_CAP_S = 5.0


def reconnect_window_s(value: float | str | None = None) -> float:
    """How long a request keeps retrying an unreachable coordinator: `value`, else
    ``PERSEUS_RECONNECT_S``, else 120 s (`ClientSettings.reconnect_s`, which checks it:
    a finite number of seconds in [0, 1 week]; 0 fails at the first error)."""
    return ClientSettings.load(reconnect_s=value).reconnect_s


def check_server_url(server_url: str) -> str:
    """`server_url` without a trailing slash; `ConfigurationError` unless it is http(s)."""
    if not server_url.startswith(("http://", "https://")):
        raise ConfigurationError(
            f"server_url={server_url!r} must be an http(s) URL, e.g. http://127.0.0.1:7787"
        )
    return server_url.rstrip("/")


class CoordinatorClient:
    """A synchronous client of one coordinator (thread-safe: httpx's client is).

    Args:
        server_url: The coordinator, e.g. ``http://127.0.0.1:7787``.
        timeout_s: Timeout of every request; a call's `timeout_s` overrides the read timeout.
        transport: An httpx transport for the client this object makes (e.g. a WSGI or mock
            transport in tests).
        client: An httpx client to use instead; requests go to absolute URLs, so its
            ``base_url`` does not matter. Its owner closes it, not `close`.
        token: The coordinator's token (``PERSEUS_TOKEN``), sent as
            ``Authorization: Bearer <token>`` with every request; None sends none.
        reconnect_s: How long a request waits for an unreachable or restarting coordinator
            (see the module docstring); default ``PERSEUS_RECONNECT_S``, else 120 s.

    Each job's credential (``X-Perseus-Job-Token``) is kept from `register_job`'s answer
    (or given with `set_job_token`, on the ranks that did not register) and sent with every
    request under that job's id. Neither appears in this object's repr or its errors.
    """

    def __init__(
        self,
        server_url: str,
        *,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        client: httpx.Client | None = None,
        token: str | None = None,
        reconnect_s: float | None = None,
    ) -> None:
        if transport is not None and client is not None:
            raise ConfigurationError("Pass a transport or a client, not both")
        self.server_url = check_server_url(server_url)
        self._auth = {"authorization": f"Bearer {token.strip()}"} if token else {}
        self._job_tokens: dict[str, str] = {}
        self._registered_token: str | None = None
        self.timeout_s = float(timeout_s)
        self.reconnect_s = reconnect_window_s(reconnect_s)
        self.retries = 0
        """How many requests this client has sent again after an outage (for logs/tests)."""
        self._closed = False
        self._owned = client is None
        self._http = client or httpx.Client(
            timeout=httpx.Timeout(self.timeout_s),
            headers={"user-agent": "perseus-client"},
            transport=transport,
        )

    # ------------------------------------------------------------------ the routes
    def register_job(self, job_info: JobInfo) -> str:
        """Register a job; returns its id."""
        self._registered_token = None
        job_id = self.request(
            "POST",
            REGISTER_JOB_URL,
            body=job_info,
            reconnect_s=min(self.reconnect_s, FIRST_CONTACT_S),
            connect_timeout_s=min(self.timeout_s, FIRST_CONNECT_TIMEOUT_S),
        )
        if not isinstance(job_id, str) or not job_id:
            raise CoordinatorRequestError(
                f"The Perseus coordinator at {self.server_url} answered "
                f"{REGISTER_JOB_URL} with {job_id!r} instead of a job id",
                url=self.server_url + REGISTER_JOB_URL,
            )
        if self._registered_token:
            self._job_tokens[job_id] = self._registered_token
        return job_id

    def job_token(self, job_id: str) -> str | None:
        """The credential of `job_id` this client holds (None: the coordinator gave none)."""
        return self._job_tokens.get(job_id)

    def set_job_token(self, job_id: str, token: str | None) -> None:
        """Use `token` as `job_id`'s credential (a rank that learnt it from rank 0)."""
        if token:
            self._job_tokens[job_id] = token
        else:
            self._job_tokens.pop(job_id, None)

    def _headers(self, path: str, has_body: bool) -> dict[str, str]:
        """Headers of a request to `path`: content type, the token, the job's credential."""
        headers = dict(self._auth)
        if has_body:
            headers["content-type"] = "application/json"
        job_id = path.rpartition("/")[2]
        if job_id in self._job_tokens:
            headers[JOB_TOKEN_HEADER] = self._job_tokens[job_id]
        return headers

    def register_rank(self, job_id: str, rank_info: RankInfo) -> None:
        """Register one rank of a job."""
        self.request("POST", REGISTER_RANK_URL.format(job_id=job_id), body=rank_info)

    def report_result(self, job_id: str, result: ProfilingResult) -> None:
        """Report one rank's measurements of a round."""
        self.request("POST", REPORT_RESULT_URL.format(job_id=job_id), body=result)

    def get_schedule(self, job_id: str, rank: int, *, timeout_s: float) -> FrequencySchedule:
        """The next schedule of `rank`: a long-poll that returns when every rank has reported.

        `timeout_s` is the read timeout; keep it above the coordinator's round timeout so
        that the coordinator's 504 (which names the missing ranks) arrives first.
        """
        raw = self.request(
            "GET",
            GET_SCHEDULE_URL.format(job_id=job_id),
            params={"rank": rank},
            timeout_s=timeout_s,
        )
        try:
            return FrequencySchedule.model_validate(raw)
        except ValueError as exc:
            raise CoordinatorRequestError(
                f"The Perseus coordinator at {self.server_url} sent rank {rank} an invalid "
                f"schedule: {exc}",
                url=self.server_url,
            ) from None

    def announce_straggler(self, job_id: str, dp_rank: int, slowdown: float) -> None:
        """Tell the coordinator that pipeline `dp_rank` runs `slowdown` times slower."""
        self.request(
            "POST",
            STRAGGLER_URL.format(job_id=job_id),
            body={"dp_rank": dp_rank, "slowdown": slowdown},
        )

    def finish_job(self, job_id: str) -> JobOutcome | None:
        """Tell the coordinator the job ended normally (once, after every rank closed);
        returns what it says the job did (None when its answer is not a `JobOutcome`: an
        older coordinator's, which the job does not need)."""
        answer = self.request("POST", FINISH_URL.format(job_id=job_id))
        try:
            return JobOutcome.model_validate(answer)
        except ValidationError:
            return None

    # ------------------------------------------------------------------ transport
    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        reconnect_s: float | None = None,
        connect_timeout_s: float | None = None,
    ) -> Any:
        """One request, retried through a coordinator outage (module docstring) for
        `reconnect_s` (default: the client's window); returns the decoded JSON answer or
        raises a `CoordinatorError`. `connect_timeout_s` caps each attempt's connect."""
        window_s = self.reconnect_s if reconnect_s is None else reconnect_s
        content = None
        if body is not None:
            content = (
                body.model_dump_json() if hasattr(body, "model_dump_json") else json.dumps(body)
            )
        first_failure: float | None = None
        backoff = _BACKOFF_FIRST_S
        while True:
            try:
                answer = self._send(method, path, content, params, timeout_s, connect_timeout_s)
            except CoordinatorError as exc:
                retryable = exc.retryable or (
                    # "job unknown" after an outage: the restart may not have restored it yet
                    isinstance(exc, JobNotFoundError) and first_failure is not None
                )
                if not retryable or window_s <= 0 or self._closed:
                    raise  # (a closed client's requests fail: nobody waits for them)
                now = time.monotonic()
                if first_failure is None:
                    first_failure = now
                    logger.warning(
                        "%s %s: %s; retrying for up to %g s (%s)",
                        method,
                        path,
                        exc,
                        window_s,
                        RECONNECT_ENV if window_s == self.reconnect_s else "a first contact",
                    )
                left = first_failure + window_s - now
                if left <= 0:
                    why = (
                        f"{RECONNECT_ENV}={self.reconnect_s:g}"
                        if window_s == self.reconnect_s
                        else "a job's first contact waits no longer"
                    )
                    raise type(exc)(
                        f"{exc} (retried for {now - first_failure:.0f} s, {why})",
                        url=exc.url,
                        status_code=exc.status_code,
                    ) from exc
                time.sleep(min(left, random.uniform(0.5, 1.0) * backoff))
                if self._closed:
                    raise
                backoff = min(_BACKOFF_CAP_S, backoff * 2)
                self.retries += 1
                continue
            if first_failure is not None:
                logger.warning(
                    "%s %s went through after %.1f s: the coordinator is back",
                    method,
                    path,
                    time.monotonic() - first_failure,
                )
            return answer

    def _send(
        self,
        method: str,
        path: str,
        content: str | None,
        params: dict[str, Any] | None,
        timeout_s: float | None,
        connect_timeout_s: float | None = None,
    ) -> Any:
        """One attempt. The errors a retry may cure are `CoordinatorUnreachableError`s."""
        url = f"{self.server_url}{path}"
        timeout = self.timeout_s if timeout_s is None else timeout_s
        connect = self.timeout_s if connect_timeout_s is None else connect_timeout_s
        try:
            response = self._http.request(
                method,
                url,
                content=content,
                params=params,
                headers=self._headers(path, content is not None),
                timeout=httpx.Timeout(self.timeout_s, read=timeout, connect=connect),
            )
        except RuntimeError as exc:
            if not self._closed:
                raise
            raise CoordinatorRequestError(
                f"{method} {url}: the client was closed", url=url
            ) from exc
        except httpx.HTTPError as exc:
            raise transport_error(
                exc,
                server_url=self.server_url,
                method=method,
                path=path,
                read_s=timeout,
                connect_s=connect,
            ) from exc
        if not response.is_success:
            raise answer_error(response, url)
        if path == REGISTER_JOB_URL:
            self._registered_token = response.headers.get(JOB_TOKEN_HEADER)
        return decode_answer(response, url)

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Close the httpx client this object made (an injected one stays open); requests
        in flight are not retried any more."""
        self._closed = True
        if self._owned:
            self._http.close()

    def __enter__(self) -> CoordinatorClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        close_on_exit(type(self).__name__, exc, lambda finish: self.close())
