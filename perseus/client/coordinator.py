"""The coordinator's HTTP API as one rank uses it.

`CoordinatorClient` speaks the routes of `perseus.protocol` and turns every failure into
the `perseus.errors` tree: an unreachable coordinator, a timeout or a transport error is a
`CoordinatorError` that names the URL; an error answer is a `JobNotFoundError` (404) or a
`CoordinatorError` carrying the status code and the coordinator's ``detail``. The httpx
client is injectable (`transport=` or `client=`), so tests can talk to an in-process app.
"""

from __future__ import annotations

import json
from types import TracebackType
from typing import Any

import httpx

from perseus.errors import ConfigurationError, CoordinatorError, JobNotFoundError
from perseus.protocol import (
    GET_SCHEDULE_URL,
    JOB_TOKEN_HEADER,
    REGISTER_JOB_URL,
    REGISTER_RANK_URL,
    REPORT_RESULT_URL,
    STRAGGLER_URL,
    FrequencySchedule,
    JobInfo,
    ProfilingResult,
    RankInfo,
)

__all__ = ["CoordinatorClient", "check_server_url"]


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
    ) -> None:
        if transport is not None and client is not None:
            raise ConfigurationError("Pass a transport or a client, not both")
        self.server_url = check_server_url(server_url)
        self._auth = {"authorization": f"Bearer {token.strip()}"} if token else {}
        self._job_tokens: dict[str, str] = {}
        self._registered_token: str | None = None
        self.timeout_s = float(timeout_s)
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
        job_id = self.request("POST", REGISTER_JOB_URL, body=job_info)
        if not isinstance(job_id, str) or not job_id:
            raise CoordinatorError(
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
            raise CoordinatorError(
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

    # ------------------------------------------------------------------ transport
    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        """One request; returns the decoded JSON answer or raises a `CoordinatorError`."""
        url = f"{self.server_url}{path}"
        timeout = self.timeout_s if timeout_s is None else timeout_s
        content = None
        if body is not None:
            content = (
                body.model_dump_json() if hasattr(body, "model_dump_json") else json.dumps(body)
            )
        try:
            response = self._http.request(
                method,
                url,
                content=content,
                params=params,
                headers=self._headers(path, content is not None),
                timeout=httpx.Timeout(self.timeout_s, read=timeout),
            )
        except httpx.ConnectError as exc:
            raise CoordinatorError(
                f"Cannot reach the Perseus coordinator at {self.server_url}: {exc}. "
                "Is it running (perseus serve) and is the URL right?",
                url=url,
            ) from exc
        except httpx.TimeoutException as exc:
            raise CoordinatorError(
                f"The Perseus coordinator at {self.server_url} did not answer {method} {path} "
                f"within {timeout:g} s ({type(exc).__name__})",
                url=url,
            ) from exc
        except httpx.HTTPError as exc:
            raise CoordinatorError(
                f"{method} {url} failed: {type(exc).__name__}: {exc}", url=url
            ) from exc
        if response.is_success:
            if path == REGISTER_JOB_URL:
                self._registered_token = response.headers.get(JOB_TOKEN_HEADER)
            try:
                return response.json()
            except ValueError as exc:
                raise CoordinatorError(
                    f"The Perseus coordinator at {url} answered {response.status_code} with "
                    f"a body that is not JSON: {response.text[:200]!r}",
                    url=url,
                    status_code=response.status_code,
                ) from exc
        try:
            detail = response.json().get("detail", response.text)
        except (ValueError, AttributeError):
            detail = response.text[:500]
        if not isinstance(detail, str):
            detail = json.dumps(detail)
        error = JobNotFoundError if response.status_code == 404 else CoordinatorError
        raise error(
            f"The Perseus coordinator at {url} answered {response.status_code} "
            f"{response.reason_phrase}: {detail}",
            url=url,
            status_code=response.status_code,
        )

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Close the httpx client this object made (an injected one stays open)."""
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
        self.close()
