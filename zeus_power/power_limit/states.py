"""The states of `zeus_power.power_limit.GlobalPowerLimitOptimizer` (`Ready`, `Warmup`,
`Profiling`, `Done`), the profile file it saves and loads (`PowerLimitProfile`), and the
warning it issues when epochs are too short (`ShortEpochWarning`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from zeus_power.errors import ZeusError
from zeus_power.power_limit.selectors import PowerLimitMeasurement

__all__ = [
    "PROFILE_VERSION",
    "Done",
    "PowerLimitProfile",
    "Profiling",
    "Ready",
    "ShortEpochWarning",
    "State",
    "Warmup",
]

PROFILE_VERSION = 1


class ShortEpochWarning(ZeusError, RuntimeWarning):  # noqa: N818 (a warning; public name)
    """Epochs are too short for a warmup + profiling window to ever finish.

    A `RuntimeWarning` for the warning machinery, and a `ZeusError` like every exception
    class of the package (so `except ZeusError` also catches it when warnings are errors).
    """


class PowerLimitProfile(BaseModel):
    """The JSON profile file: the measurements and the optimum chosen from them."""

    model_config = ConfigDict(extra="forbid")

    version: int = PROFILE_VERSION
    measurements: list[PowerLimitMeasurement] = Field(min_length=1)
    optimal_power_limit_w: int | None = None
    """The optimum when saved (informational: loading re-selects with the current selector)."""
    selector: str | None = None
    emulated: bool = Field(default=False, exclude_if=lambda emulated: not emulated)
    """Measured on emulated GPUs (the emulator's model); absent from files of real GPUs."""


# --------------------------------------------------------------------------- states


class _PowerLimitState(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Ready(_PowerLimitState):
    """Ready to start measuring the next power limit.

    Initial state when there is no profile to load.

    Ready -> Warmup after the `steps`'th `on_step_begin` (-> Profiling if warmup_steps=0).
    """

    next_power_limit_w: int
    steps: int


class Warmup(_PowerLimitState):
    """Warming up at a power limit.

    Warmup -> Profiling on the `steps`'th `on_step_begin`.
    Warmup -> Ready on `on_epoch_end` before that (window cancelled, max limit restored).
    """

    current_power_limit_w: int
    steps: int


class Profiling(_PowerLimitState):
    """Profiling a power limit.

    Profiling -> Warmup after the `steps`'th `on_step_begin` when limits remain.
    Profiling -> Done after the `steps`'th `on_step_begin` when none remain.
    Profiling -> Ready on `on_epoch_end` before that (window cancelled, max limit restored).
    """

    current_power_limit_w: int
    steps: int


class Done(_PowerLimitState):
    """All power limits profiled (or a profile loaded); the optimum is applied. Final."""

    optimal_power_limit_w: int


State = Ready | Warmup | Profiling | Done
