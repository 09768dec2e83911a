"""Settings of the batch-size optimizer server (environment prefix `ZEUS_BSO_`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["BSOSettings"]


class BSOSettings(BaseSettings):
    """Server settings, read from `ZEUS_BSO_*` environment variables or keyword arguments."""

    model_config = SettingsConfigDict(env_prefix="ZEUS_BSO_", extra="forbid", frozen=True)

    db_url: str = Field(default="sqlite:///./zeus_bso.db", min_length=1)
    """SQLAlchemy URL: a SQLite file by default, e.g. `postgresql+psycopg://u:p@host/db`."""
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    """Log level of the server's logger."""
    sqlite_busy_timeout_s: float = Field(default=30.0, gt=0.0)
    """How long a SQLite transaction waits for the write lock before failing."""
    trial_timeout_s: float | None = Field(default=None, gt=0.0)
    """A trial not reported this long after it was dispatched is marked `timed_out` (its
    client is taken for dead) and its batch size is handed out again; a late report is
    still accepted. Checked whenever a trial is requested. Default: wait forever, as Zeus
    does; set it above the longest training run you expect."""
