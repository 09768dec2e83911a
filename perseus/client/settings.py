"""The client's settings: every ``PERSEUS_*`` variable a training rank reads, in one place.

`ClientSettings.load` reads the environment once, validates it, and turns a bad value into
a `ConfigurationError` that names the variable (never the token's value); the hook builds
it in its constructor and passes the pieces down (`CoordinatorClient`, the trace, the
timing, the log). Arguments given to the hook win over the environment.

| Variable | Field | Default | Meaning |
|---|---|---|---|
| ``PERSEUS_TIMING`` | `timing` | ``auto`` | ``sync``, ``events`` or ``auto`` (`perseus.client.timing`) |
| ``PERSEUS_TOKEN`` | `token` | none | the coordinator's token, sent as a bearer token |
| ``PERSEUS_RECONNECT_S`` | `reconnect_s` | 120 | how long a request waits for a restarting coordinator (0 to 604800 s) |
| ``PERSEUS_LOG_LEVEL`` | `log_level` | ``INFO`` | rank 0's ``perseus`` log on stderr (DEBUG, INFO, WARNING, ERROR) |
| ``PERSEUS_TRACE_DIR`` | `trace_dir` | none | each rank writes ``rank{R}.jsonl`` there |
| ``PERSEUS_EMULATE_*`` | `emulation` | see `EmulationSettings` | emulated frequency control on a stand-in GPU |

An empty variable counts as unset.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from perseus.client.console import LOG_LEVELS
from perseus.client.emulation import EmulationSettings
from perseus.errors import ConfigurationError

__all__ = ["DEFAULT_RECONNECT_S", "MAX_RECONNECT_S", "TIMINGS", "ClientSettings"]

TIMINGS = ("auto", "sync", "events")
"""The hook's instruction timings: ``sync`` (device synchronisation around each one),
``events`` (CUDA events), and ``auto`` (events where they can run, else sync)."""

DEFAULT_RECONNECT_S = 120.0
MAX_RECONNECT_S = 7 * 24 * 3600.0


class ClientSettings(BaseSettings):
    """A training rank's settings (env prefix ``PERSEUS_``; table in the module docstring).

    Attributes:
        timing: How instructions are timed: ``sync``, ``events`` or ``auto``.
        token: The coordinator's token (``Authorization: Bearer``); None sends none.
        reconnect_s: Seconds a request keeps retrying an unreachable or restarting
            coordinator, in [0, 1 week]; 0 fails at the first error.
        log_level: The level of rank 0's ``perseus`` log (None: INFO).
        trace_dir: Where each rank writes its JSONL trace (None: no trace).
        emulation: Emulation on a GPU with a stand-in (``PERSEUS_EMULATE_*``).
    """

    model_config = SettingsConfigDict(
        env_prefix="PERSEUS_",
        extra="forbid",  # unknown keywords; other PERSEUS_* variables (the coordinator's) are not read
        frozen=True,
        env_ignore_empty=True,
        hide_input_in_errors=True,
    )

    timing: str = "auto"
    token: SecretStr | None = None
    reconnect_s: float = DEFAULT_RECONNECT_S
    log_level: str | None = None
    trace_dir: Path | None = None
    emulation: EmulationSettings = Field(default_factory=EmulationSettings)

    @field_validator("timing")
    @classmethod
    def _timing(cls, value: str) -> str:
        if value not in TIMINGS:
            raise ValueError(
                f"timing={value!r} (PERSEUS_TIMING) is not one of {', '.join(TIMINGS)}"
            )
        return value

    @field_validator("token")
    @classmethod
    def _token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value().strip():
            return None
        return SecretStr(value.get_secret_value().strip())

    @field_validator("reconnect_s", mode="before")
    @classmethod
    def _reconnect(cls, value: Any) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            seconds = math.nan
        if not (math.isfinite(seconds) and 0 <= seconds <= MAX_RECONNECT_S):
            raise ValueError(
                f"PERSEUS_RECONNECT_S={value!r} must be a number of seconds between 0 and "
                f"{MAX_RECONNECT_S:g} (how long a rank waits for a restarted coordinator; "
                f"default {DEFAULT_RECONNECT_S:g})"
            )
        return seconds

    @field_validator("log_level")
    @classmethod
    def _log_level(cls, value: str | None) -> str | None:
        if value is not None and value.strip().upper() not in LOG_LEVELS:
            raise ValueError(f"PERSEUS_LOG_LEVEL={value!r} is not one of {', '.join(LOG_LEVELS)}")
        return value

    @classmethod
    def load(cls, **given: Any) -> ClientSettings:
        """The environment's settings, overridden by `given` (None values are ignored);
        a `ConfigurationError` naming the variable if one is invalid."""
        try:
            return cls(**{k: v for k, v in given.items() if v is not None})
        except ValidationError as exc:
            raise ConfigurationError(_describe(exc)) from None

    @property
    def token_value(self) -> str | None:
        """The token itself (None: no token); never logged."""
        return self.token.get_secret_value() if self.token is not None else None


def _describe(exc: ValidationError) -> str:
    """One line per bad setting, naming its variable; a token's value is never shown."""
    prefix = "PERSEUS_EMULATE_" if exc.title == EmulationSettings.__name__ else "PERSEUS_"
    lines = []
    for error in exc.errors(include_input=False):
        field = str(error["loc"][0]) if error["loc"] else "?"
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] != "value_error":
            message = f"{prefix}{field.upper()}: {message}"
        lines.append(message)
    return "; ".join(lines)
