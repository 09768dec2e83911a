"""The one error tree of `zeus_power`: every exception class of the package derives from it.

`except ZeusError` catches the errors `zeus_power` raises itself, device errors included
(invalid pydantic models still raise pydantic's `ValidationError`, as pydantic does). The
classes live here except where noted; this module imports nothing of the package, so
every layer (the device layer too) can build on it.

```
ZeusError
├── ZeusConfigError                   a bad argument or setting (η outside [0, 1], factor < 1);
│                                     also a ValueError
├── ZeusMonitorError                  a measurement window misused (unknown or duplicate name)
├── ZeusProfileError                  a malformed power-limit profile file
├── ZeusCostThresholdExceededError    the next epoch would cross the cost threshold
├── ZeusMasterError                   a training subprocess failed or wrote no result
├── ZeusBSOError                      the batch-size optimizer service or its client
│   ├── ZeusBSOConfigError            a job spec that differs from the registered one
│   ├── ZeusBSOJobNotFoundError       an unknown job id
│   ├── ZeusBSOTrialNotFoundError     a known job without that trial number
│   ├── ZeusBSOOperationOrderError    client methods called out of order
│   ├── ZeusBSOTrainFailError         this trial failed (early stop, max epochs); relaunch
│   ├── ZeusBSOConflictError          a trial already reported, or no batch size is left
│   └── ZeusBSORuntimeError           the server could not be reached or answered an error
├── GPUError                          the device layer (zeus_power.device.base); has gpu_index
│   ├── GPUNotSupportedError          not supported by this GPU / backend
│   ├── GPUPermissionError            needs root or SYS_ADMIN
│   ├── GPUValueError                 a clock or power value out of range (also a ValueError)
│   ├── GPUInitError                  the backend could not be initialised
│   └── StoppingError                 the GPU daemon is stopping (zeus_power.gpud.state)
├── RequestError                      a request the GPU daemon refuses, with its HTTP status
│                                     (zeus_power.gpud.routes: the daemon's own HTTP layer)
├── BodyTooLargeError                 a request body over the server's limit (413); also
│                                     FastAPI's HTTPException (zeus_power.serving)
└── ShortEpochWarning                 epochs too short to finish a profiling window; issued,
                                      not raised (zeus_power.power_limit.states); also a
                                      RuntimeWarning, so warning filters treat it as one
```

`ZeusBSORuntimError` (sic) is kept as an alias of `ZeusBSORuntimeError` for code written
against Zeus. Every message names the offending value and, where there is one, the fix.
"""

from __future__ import annotations

__all__ = [
    "ZeusBSOConfigError",
    "ZeusBSOConflictError",
    "ZeusBSOError",
    "ZeusBSOJobNotFoundError",
    "ZeusBSOOperationOrderError",
    "ZeusBSORuntimError",
    "ZeusBSORuntimeError",
    "ZeusBSOTrainFailError",
    "ZeusBSOTrialNotFoundError",
    "ZeusConfigError",
    "ZeusCostThresholdExceededError",
    "ZeusError",
    "ZeusMasterError",
    "ZeusMonitorError",
    "ZeusProfileError",
]


class ZeusError(Exception):
    """Root of every error (and warning) `zeus_power` raises on purpose."""


class ZeusConfigError(ZeusError, ValueError):
    """An argument or setting is out of range; the message names it and the valid range."""


class ZeusMonitorError(ZeusError):
    """A measurement window was misused: ending an unknown window or re-opening an open one."""


class ZeusProfileError(ZeusError):
    """A power-limit profile file is malformed or does not fit the GPUs."""


class ZeusMasterError(ZeusError):
    """A training subprocess launched by `ZeusMaster` failed or reported no result."""


class ZeusCostThresholdExceededError(ZeusError):
    """Raised when the predicted cost of the next epoch exceeds the cost threshold.

    In data-parallel training only the master process predicts `next_cost`; raising
    this error there terminates it, and the launcher terminates the other processes.

    Attributes:
        time_consumed: Time consumed until the current epoch (s).
        energy_consumed: Energy consumed until the current epoch (J).
        cost: Zeus's energy-time cost until the current epoch.
        next_cost: Predicted cost after the next epoch.
        cost_thresh: The cost threshold.
    """

    def __init__(
        self,
        time_consumed: float,
        energy_consumed: float,
        cost: float,
        next_cost: float,
        cost_thresh: float,
    ) -> None:
        super().__init__(
            f"Next expected cost {next_cost:.3f} exceeds the cost threshold {cost_thresh:.3f}"
            f" (so far: time {time_consumed:.3f} s, energy {energy_consumed:.3f} J,"
            f" cost {cost:.3f}). Stop this run and try another configuration."
        )
        self.time_consumed = time_consumed
        self.energy_consumed = energy_consumed
        self.cost = cost
        self.next_cost = next_cost
        self.cost_thresh = cost_thresh


class ZeusBSOError(ZeusError):
    """Root of the batch-size optimizer's errors."""


class ZeusBSOConfigError(ZeusBSOError):
    """A job spec is invalid or differs from the spec registered under the same job id."""


class ZeusBSOJobNotFoundError(ZeusBSOError):
    """The server does not know the job id."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"Unknown job id {job_id!r}: register it first (POST /jobs).")
        self.job_id = job_id


class ZeusBSOTrialNotFoundError(ZeusBSOError):
    """The job exists but has no trial with that number (HTTP 404)."""


class ZeusBSOOperationOrderError(ZeusBSOError):
    """Client methods were called out of order (e.g. `on_evaluate` before `on_train_begin`)."""


class ZeusBSOTrainFailError(ZeusBSOError):
    """This trial failed (early stop or max epochs); the batch size will not be retried.

    Relaunch the training script: the optimizer will hand out another batch size.
    """


class ZeusBSOConflictError(ZeusBSOError):
    """The request conflicts with the job's state (trial already reported, no batch size left)."""


class ZeusBSORuntimeError(ZeusBSOError):
    """The server could not be reached, or answered with an error."""

    def __init__(self, message: str, *, url: str | None = None, status_code: int | None = None):
        super().__init__(message)
        self.url = url
        self.status_code = status_code


ZeusBSORuntimError = ZeusBSORuntimeError
