"""Settings of the batch-size optimizer server (environment prefix `ZEUS_BSO_`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from zeus_power.bearer import check_bearer_token

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
    token: SecretStr | None = Field(default=None, repr=False)
    """The shared secret every request but ``GET /health`` must present as
    ``Authorization: Bearer <token>`` (``ZEUS_BSO_TOKEN``; at least 16 characters; clients
    read the same variable). None: no authentication (loopback only, for `zeus_power.cli`)."""
    max_body_bytes: int = Field(default=1024 * 1024, ge=1024)
    """Request bodies larger than this are refused with 413, unread."""
    header_timeout_s: float = Field(default=10.0, gt=0, allow_inf_nan=False)
    """Seconds a connection may take to send its request headers before it is closed."""

    @field_validator("token", mode="before")
    @classmethod
    def _check_token(cls, value: object) -> object:
        return check_bearer_token(value)

    @property
    def token_value(self) -> str | None:
        """The token in clear (for the auth middleware only; never log it)."""
        return self.token.get_secret_value() if self.token is not None else None
