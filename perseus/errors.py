"""The Perseus exception tree.

```
PerseusError
├── ConfigurationError         bad settings, unknown scheduler, bad scheduler args
├── ProfileError               a malformed instruction profile (CSV)
├── ScheduleError              bad pipeline schedule parameters, plans that do not fit a DAG
│   └── PlanError              a plan file that is invalid for a profile/schedule
├── SolverError                the frontier solver could not run
├── CoordinatorError           the coordinator could not be reached or answered an error
│   └── JobNotFoundError       an unknown job id
└── RankError                  a rank misbehaved (bad registration, died mid-round, wrong order)
```

Every message names the offending value and, where there is one, the fix.
"""

from __future__ import annotations

__all__ = [
    "ConfigurationError",
    "CoordinatorError",
    "JobNotFoundError",
    "PerseusError",
    "PlanError",
    "ProfileError",
    "RankError",
    "ScheduleError",
    "SolverError",
]


class PerseusError(Exception):
    """Root of every error Perseus raises on purpose."""


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


class CoordinatorError(PerseusError):
    """The coordinator could not be reached, or answered with an error."""

    def __init__(self, message: str, *, url: str | None = None, status_code: int | None = None):
        super().__init__(message)
        self.url = url
        self.status_code = status_code


class JobNotFoundError(CoordinatorError):
    """The coordinator does not know the job id."""


class RankError(PerseusError):
    """A rank registered wrongly, died mid-round, or executed instructions out of schedule."""
