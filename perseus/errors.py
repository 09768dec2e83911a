"""The Perseus exception tree, the only one in `perseus` and `schedulers`.

Every class knows the HTTP status the coordinator answers with when it escapes a request
(`http_status`; `PerseusError.status` is the instance's, which a `CoordinatorError`
carrying a `status_code` overrides). `perseus.server.errors` reads it in one place.

```
PerseusError                       400  bad input (the root's default)
├── ConfigurationError             400  bad settings, unknown scheduler, bad scheduler args
│   └── InvalidJobError            422  a job description the coordinator cannot accept
├── ProfileError                   400  a malformed instruction profile (CSV)
├── ScheduleError                  400  bad pipeline schedule parameters, plans unfit for a DAG
│   └── PlanError                  400  a plan file that is invalid for a profile/schedule
├── SolverError                    400  the frontier solver could not run
├── CoordinatorError               400  a coordinator failure (`status_code`: the status it
│   │                                   answers with on the server, answered on the client)
│   ├── CoordinatorRequestError    ---  client side: a rank's request failed or was refused
│   │   └── CoordinatorUnreachableError  client side, retryable: refused, reset, proxy 502/503/504
│   ├── JobNotFoundError           404  an unknown (or evicted) job id
│   ├── JobFailedError             409  the job failed earlier (status_code: its failure's)
│   ├── JobFinishedError           409  the job has finished (its ranks closed normally)
│   ├── RoundTimeoutError          504  not every rank asked for its schedule in time
│   └── SchedulerFailedError       500  the job's scheduler crashed (status_code 400 when it
│                                       rejected its input: a PerseusError or ValueError)
└── RankError                      400  a rank misbehaved (died mid-round, wrong order)
    ├── InvalidRankError           422  rank/dp/pp/tp out of range, duplicate coordinates
    │   └── NotALeaderError        422  a rank that is not a leader acted as one (protocol 2)
    ├── InvalidResultError         422  a result whose shapes do not fit the rank's schedule
    └── RankConflictError          409  the same rank registered twice, result reported twice
```

Every message names the offending value and, where there is one, the fix. Whether a
later attempt may cure an error is a property of its class (`CoordinatorError.retryable`):
only `CoordinatorUnreachableError` is, and `JobNotFoundError` once an outage was seen
(`perseus.client.coordinator`).
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "ConfigurationError",
    "CoordinatorError",
    "CoordinatorRequestError",
    "CoordinatorUnreachableError",
    "InvalidJobError",
    "InvalidRankError",
    "InvalidResultError",
    "JobFailedError",
    "JobFinishedError",
    "JobNotFoundError",
    "NotALeaderError",
    "PerseusError",
    "PlanError",
    "ProfileError",
    "RankConflictError",
    "RankError",
    "RoundTimeoutError",
    "ScheduleError",
    "SchedulerFailedError",
    "SolverError",
]


class PerseusError(Exception):
    """Root of every error Perseus raises on purpose."""

    http_status: ClassVar[int] = 400
    """The coordinator's answer when this error escapes a request."""

    @property
    def status(self) -> int:
        """This error's HTTP status (the class's `http_status` unless the instance has one)."""
        return self.http_status


class ConfigurationError(PerseusError):
    """Invalid settings, scheduler name, or scheduler arguments."""


class InvalidJobError(ConfigurationError):
    """A job description the coordinator cannot accept (beyond the model's validation)."""

    http_status = 422


class ProfileError(PerseusError):
    """An instruction profile is malformed or incomplete."""


class ScheduleError(PerseusError):
    """Invalid pipeline schedule parameters or an execution that deviates from a schedule."""


class PlanError(ScheduleError):
    """A frequency plan does not fit its profile or schedule."""


class SolverError(PerseusError):
    """The frontier solver could not produce a result."""


class CoordinatorError(PerseusError):
    """The coordinator could not be reached, or answered with an error.

    `status_code` is the HTTP status involved: the one a coordinator answered with (client
    side), or the one to answer with (server side); None falls back to `http_status`.
    """

    def __init__(self, message: str, *, url: str | None = None, status_code: int | None = None):
        super().__init__(message)
        self.url = url
        self.status_code = status_code

    retryable: ClassVar[bool] = False
    """Whether sending the request again may cure it (the coordinator went away)."""

    @property
    def status(self) -> int:
        return self.status_code if self.status_code is not None else self.http_status


class CoordinatorRequestError(CoordinatorError):
    """Client side: a rank's request to the coordinator failed (a timeout, a transport
    error, an answer that is not what the route promises) or was refused (`status_code`:
    the status the coordinator answered with; `url`: the request's)."""


class CoordinatorUnreachableError(CoordinatorRequestError):
    """Client side: the coordinator went away (connection refused or reset, a connect
    timeout, a proxy's 502/503/504); the client retries it for ``PERSEUS_RECONNECT_S``."""

    retryable = True


class JobNotFoundError(CoordinatorError):
    """The coordinator does not know the job id."""

    http_status = 404


class JobFailedError(CoordinatorError):
    """The job failed earlier; every later call gets the failure's message."""

    http_status = 409


class JobFinishedError(CoordinatorError):
    """The job has finished (``POST /finish``): it runs no more rounds."""

    http_status = 409


class RoundTimeoutError(CoordinatorError):
    """The round's barrier did not complete within the round timeout."""

    http_status = 504


class SchedulerFailedError(CoordinatorError):
    """The job's scheduler raised; `status_code` is 400 (bad input) or 500 (crash)."""

    http_status = 500


class RankError(PerseusError):
    """A rank registered wrongly, died mid-round, or executed instructions out of schedule."""


class InvalidRankError(RankError):
    """A rank (or its dp/pp/tp coordinates) does not fit the job."""

    http_status = 422


class NotALeaderError(InvalidRankError):
    """In a job with leaders (protocol 2), a rank that is not one registered, reported or
    asked for a schedule: the message names the rule (`perseus.domain.layout.Leaders`)."""


class InvalidResultError(RankError):
    """A rank's result that cannot be its schedule's (refused; the rank may send it again)."""

    http_status = 422


class RankConflictError(RankError):
    """A rank did something twice that may happen once (register, report a round)."""

    http_status = 409
