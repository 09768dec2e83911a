"""The Perseus exception tree, the only one in `perseus` (its schedulers included).

```
PerseusError                          every error Perseus raises on purpose
├── ConfigurationError                bad settings, unknown scheduler, bad scheduler arguments
├── ProfileError                      a malformed or incomplete instruction profile (CSV)
├── ScheduleError                     bad pipeline schedule parameters; execution off schedule
│   └── PlanError                     a plan that does not fit its profile or schedule
├── SolverError                       the frontier solver could not produce a result
├── DeviceError                       CLIENT side: the rank's GPU refused or failed a call
│                                     (the device layer's `GPUError` is its `__cause__`)
├── CoordinatorError                  CLIENT side: a request to the coordinator failed
│   │                                 (`url`; `status_code`: the status it answered, if any)
│   ├── CoordinatorRequestError       it failed or was refused: a read timeout, a transport
│   │   │                             error, an error answer, an answer that is not JSON
│   │   └── CoordinatorUnreachableError  it went away: refused, reset, a connect timeout,
│   │                                 a proxy's 502/503/504 (`retryable`)
│   └── JobNotFoundError              it answered 404: it does not know (or evicted) the job
├── JobError                          SERVER side: the coordinator refuses a call (`job_id`)
│   ├── InvalidJobError               a job description it cannot accept
│   ├── UnknownJobError               an unknown or evicted job id
│   ├── JobStateError                 the job cannot take the call now: not started yet,
│   │                                 failed earlier (`cause`: that failure), or finished
│   ├── CoordinatorBusyError          it holds its limit of live jobs, or is shutting down
│   ├── RoundTimeoutError             not every talking rank asked for its schedule in time
│   └── SchedulerFailedError          the job's scheduler refused its input or crashed (`cause`)
└── RankError                         a rank misbehaved (`rank`): registered wrongly, died
    │                                 mid-round, called the hook out of order
    ├── InvalidRankError              rank or dp/pp/tp coordinates out of range or taken; a
    │                                 rank that is not a leader acting as one (protocol 2)
    ├── InvalidResultError            a result whose shapes do not fit the rank's schedule
    └── RankConflictError             something done twice that may happen once (register,
                                      report a round)
```

These classes know nothing of HTTP: the coordinator maps them to statuses in one place,
`perseus.server.errors`. Whether a retry may cure an error is a property of its class
(`PerseusError.retryable`). Every message names the offending value and, where there is
one, the fix.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "ConfigurationError",
    "CoordinatorBusyError",
    "CoordinatorError",
    "CoordinatorRequestError",
    "CoordinatorUnreachableError",
    "DeviceError",
    "InvalidJobError",
    "InvalidRankError",
    "InvalidResultError",
    "JobError",
    "JobNotFoundError",
    "JobStateError",
    "PerseusError",
    "PlanError",
    "ProfileError",
    "RankConflictError",
    "RankError",
    "RoundTimeoutError",
    "ScheduleError",
    "SchedulerFailedError",
    "SolverError",
    "UnknownJobError",
]


class PerseusError(Exception):
    """Root of every error Perseus raises on purpose."""

    retryable: ClassVar[bool] = False
    """Whether the same call, made again later, may succeed (the cause may go away)."""


class ConfigurationError(PerseusError):
    """Invalid settings, scheduler name, or scheduler arguments."""


class ProfileError(PerseusError):
    """An instruction profile is malformed or incomplete."""


class ScheduleError(PerseusError):
    """Invalid pipeline schedule parameters or an execution that deviates from a schedule."""


class PlanError(ScheduleError):
    """A frequency plan does not fit its profile or schedule."""


class SolverError(PerseusError):
    """The frontier solver could not produce a result."""


# ---------------------------------------------------------------------- client side
class DeviceError(PerseusError):
    """Client side: the rank's GPU refused or failed a call (opening it, reading its clocks
    or counter, setting a clock). The device layer (`zeus_power.device`) raises its own
    `GPUError`, which knows nothing of Perseus; the hook raises it as this, with the
    `GPUError` as ``__cause__``, so that a user catches `PerseusError` alone."""


class CoordinatorError(PerseusError):
    """Client side: a request to the coordinator failed.

    Attributes:
        url: The URL of the request, when known.
        status_code: The HTTP status the coordinator answered with; None when it did not
            answer (unreachable, timed out, transport error).
    """

    def __init__(self, message: str, *, url: str | None = None, status_code: int | None = None):
        super().__init__(message)
        self.url = url
        self.status_code = status_code


class CoordinatorRequestError(CoordinatorError):
    """Client side: a rank's request to the coordinator failed (a timeout, a transport
    error, an answer that is not what the route promises) or was refused (`status_code`:
    the status the coordinator answered with; `url`: the request's)."""


class CoordinatorUnreachableError(CoordinatorRequestError):
    """Client side: the coordinator went away (connection refused or reset, a connect
    timeout, a proxy's 502/503/504): it may be restarting, so a later attempt may succeed
    (the client retries for ``PERSEUS_RECONNECT_S``)."""

    retryable = True


class JobNotFoundError(CoordinatorError):
    """Client side: the coordinator answered 404, it does not know the job (never
    registered, evicted, or not restored after a restart)."""


# ---------------------------------------------------------------------- server side
class JobError(PerseusError):
    """Server side: the coordinator refuses a call about a job.

    Attributes:
        job_id: The job's id, when the call named one.
    """

    def __init__(self, message: str, *, job_id: str | None = None):
        super().__init__(message)
        self.job_id = job_id


class InvalidJobError(JobError):
    """A job description the coordinator cannot accept (beyond the model's validation)."""


class UnknownJobError(JobError):
    """The coordinator does not know the job id (never registered, or evicted)."""


class JobStateError(JobError):
    """The job cannot take this call now: it has not started (not every rank registered),
    it failed earlier, or it has finished.

    Attributes:
        cause: The job's failure when it failed earlier (every later call carries its
            message); None otherwise.
    """

    def __init__(
        self, message: str, *, job_id: str | None = None, cause: PerseusError | None = None
    ):
        super().__init__(message, job_id=job_id)
        self.cause = cause


class CoordinatorBusyError(JobError):
    """The coordinator holds its limit of live jobs, or is shutting down."""

    retryable = True


class RoundTimeoutError(JobError):
    """The round's barrier did not complete within the round timeout (the job fails)."""


class SchedulerFailedError(JobError):
    """The job's scheduler raised: it refused its input, or crashed (the job fails).

    Attributes:
        cause: What the scheduler raised.
    """

    def __init__(
        self, message: str, *, job_id: str | None = None, cause: BaseException | None = None
    ):
        super().__init__(message, job_id=job_id)
        self.cause = cause


# ---------------------------------------------------------------------- ranks
class RankError(PerseusError):
    """A rank registered wrongly, died mid-round, or executed instructions out of schedule.

    Attributes:
        rank: The rank at fault, when one is known.
    """

    def __init__(self, message: str, *, rank: int | None = None):
        super().__init__(message)
        self.rank = rank


class InvalidRankError(RankError):
    """A rank (or its dp/pp/tp coordinates) does not fit the job, or a rank that is not a
    leader of a protocol-2 job acted as one (the message names the rule)."""


class InvalidResultError(RankError):
    """A rank's result that cannot be its schedule's (refused; the rank may send it again)."""


class RankConflictError(RankError):
    """A rank did something twice that may happen once (register, report a round)."""
