"""The client's settings: every ``PERSEUS_*`` variable a training rank reads, in one place.

`ClientSettings.load` reads the environment once, validates it, and turns a bad value into
a `ConfigurationError` that names the variable (never the token's value); the hook builds
it in its constructor and passes the pieces down (`CoordinatorClient`, the trace, the
timing, the log). Arguments given to the hook win over the environment.

| Variable | Field | Default | Meaning |
|---|---|---|---|
| ``PERSEUS_TIMING`` | `timing` | ``auto`` | ``sync``, ``events`` or ``auto`` (`perseus.client.gpu.timing`) |
| ``PERSEUS_TOKEN`` | `token` | none | the coordinator's token, sent as a bearer token |
| ``PERSEUS_RECONNECT_S`` | `reconnect_s` | 120 | how long a request waits for a restarting coordinator (0 to 604800 s) |
| ``PERSEUS_LOG_LEVEL`` | `log_level` | ``INFO`` | rank 0's ``perseus`` log on stderr (DEBUG, INFO, WARNING, ERROR) |
| ``PERSEUS_TRACE_DIR`` | `trace_dir` | none | each rank writes ``rank{R}.jsonl`` there |
| ``PERSEUS_EMULATE_*`` | `emulation` | see `EmulationSettings` | emulated frequency control on a stand-in GPU (`perseus.client.gpu.emulation`) |

An empty variable counts as unset.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from perseus.client.console import LOG_LEVELS
from perseus.errors import ConfigurationError
from zeus_power.device import DEFAULT_ACTIVITY, Workload

__all__ = [
    "DEFAULT_RECONNECT_S",
    "KIND_PRESETS",
    "MAX_RECONNECT_S",
    "TIMINGS",
    "ClientSettings",
    "EmulationSettings",
]

TIMINGS = ("auto", "sync", "events")
"""The hook's instruction timings: ``sync`` (device synchronisation around each one),
``events`` (CUDA events), and ``auto`` (events where they can run, else sync)."""

DEFAULT_RECONNECT_S = 120.0
MAX_RECONNECT_S = 7 * 24 * 3600.0


KIND_PRESETS: Mapping[str, Mapping[str, tuple[float, float]]] = {
    "gpt3": {"forward": (0.479, 0.826), "backward": (0.739, 0.753)},
    "bloom": {"forward": (0.711, 0.760), "backward": (0.504, 0.761)},
    "uniform": {"forward": (0.0, DEFAULT_ACTIVITY), "backward": (0.0, DEFAULT_ACTIVITY)},
}
"""Per instruction kind, (memory fraction, activity) of the emulated work: the medians over
the stages of the A40 fits of the SOSP'24 GPT-3 175B and Bloom 176B profiles
(the per-kind medians `scripts/calibrate_emulator.py` prints; ``docs/emulator.md``). The split backward's
halves (``backward_input``, ``backward_weight``) take the backward's: no published profile
measures them apart. ``uniform`` is the emulator before kinds differed."""

MAX_NOMINAL_MS = 1e6
_NominalMs = Annotated[float, Field(gt=0.0, le=MAX_NOMINAL_MS, allow_inf_nan=False)]


class EmulationSettings(BaseSettings):
    """How the hook emulates frequency control on a stand-in GPU (env ``PERSEUS_EMULATE_*``).

    Attributes:
        stretch: Stretch each instruction's wall time by the model's ratio for the clock in
            force (``PERSEUS_EMULATE_STRETCH``). Off: measure only.
        nominal: Use the nominal per-instruction time at the max clock instead of the
            measured one (``PERSEUS_EMULATE_NOMINAL``).
        nominal_ms: Nominal times at the max clock in ms by instruction name, a JSON object
            such as ``{"forward": 10, "backward": 20, "forward@3": 5}`` (``name@stage``
            for one pipeline stage; ``PERSEUS_EMULATE_NOMINAL_MS``). Times the training job
            passes itself (``nominal_time_s``) win.
        kinds: Per-kind workload preset, a key of `KIND_PRESETS` (``PERSEUS_EMULATE_KINDS``).
        memory_fraction: Share of an instruction's time at the max clock that does not
            scale with the SM clock, for every kind (``PERSEUS_EMULATE_MEMORY_FRACTION``;
            default: the preset's per kind).
        activity: Dynamic-power activity of every kind (``PERSEUS_EMULATE_ACTIVITY``;
            default: the preset's per kind).
        truth: Append every executed instruction's model time and energy to
            ``truth/rank{R}.csv`` (``PERSEUS_EMULATE_TRUTH``): for tests and benchmarks.
    """

    model_config = SettingsConfigDict(env_prefix="PERSEUS_EMULATE_", extra="forbid", frozen=True)

    stretch: bool = True
    nominal: bool = False
    nominal_ms: dict[str, _NominalMs] | None = Field(default=None, max_length=1024)
    kinds: Literal["gpt3", "bloom", "uniform"] = "gpt3"
    memory_fraction: float | None = Field(default=None, ge=0.0, le=1.0)
    activity: float | None = Field(default=None, gt=0.0, le=3.0)
    truth: Path | None = None

    def workload(self, kind: str) -> Workload:
        """The emulated work of one instruction of `kind`, per unit of time at the max clock."""
        preset = KIND_PRESETS[self.kinds]
        memory_fraction, activity = preset.get(kind, preset["backward"])
        if self.memory_fraction is not None:
            memory_fraction = self.memory_fraction
        if self.activity is not None:
            activity = self.activity
        return Workload.from_memory_fraction(memory_fraction, activity=activity)


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
