"""How `GlobalPowerLimitOptimizer` picks its optimum: the measurements and the selectors.

- `PowerLimitMeasurement`: energy and time of the profiling window of one power limit;
- `OptimumSelector` and its strategies: `Energy`, `Time`, `ZeusCost`,
  `MaxSlowdownConstraint`, each picking a power limit (W) from a list of measurements.

All are re-exported by `zeus_power.power_limit`, where Zeus users import them from.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from zeus_power.errors import ZeusConfigError
from zeus_power.metric import check_eta_knob, zeus_cost

__all__ = [
    "Energy",
    "MaxSlowdownConstraint",
    "OptimumSelector",
    "PowerLimitMeasurement",
    "Time",
    "ZeusCost",
]


class PowerLimitMeasurement(BaseModel):
    """Energy and time of the profiling window of one power limit.

    Loads Zeus's field names (`power_limit`, `energy`, `time`) too.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    power_limit_w: int = Field(gt=0, validation_alias=AliasChoices("power_limit_w", "power_limit"))
    """The power limit, in watts."""
    energy_j: float = Field(ge=0.0, validation_alias=AliasChoices("energy_j", "energy"))
    """Energy of the profiling window over all GPUs (and ranks), in joules."""
    time_s: float = Field(ge=0.0, validation_alias=AliasChoices("time_s", "time"))
    """Duration of the profiling window, in seconds."""


def _check_measurements(measurements: Sequence[PowerLimitMeasurement]) -> None:
    if not measurements:
        raise ZeusConfigError("Cannot select a power limit from no measurements.")


class OptimumSelector(abc.ABC):
    """Base class for optimum power limit selectors."""

    @abc.abstractmethod
    def select(self, measurements: list[PowerLimitMeasurement]) -> int:
        """Select the optimal power limit (W) from measurements."""

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({params})"


class Energy(OptimumSelector):
    """Selects the power limit that minimizes energy (the lower limit on ties)."""

    def select(self, measurements: list[PowerLimitMeasurement]) -> int:
        _check_measurements(measurements)
        return min(measurements, key=lambda m: (m.energy_j, m.power_limit_w)).power_limit_w


class Time(OptimumSelector):
    """Selects the power limit that minimizes time (the lower limit on ties).

    This need not be the maximum limit, as time measurements are noisy; when times are
    that close, a lower limit draws less power anyway.
    """

    def select(self, measurements: list[PowerLimitMeasurement]) -> int:
        _check_measurements(measurements)
        return min(measurements, key=lambda m: (m.time_s, m.power_limit_w)).power_limit_w


class ZeusCost(OptimumSelector):
    """Selects the power limit minimizing η·Energy + (1 − η)·MaxPower·Time.

    MaxPower is the highest measured power limit times `world_size` (the energy is summed
    over the job's GPUs).

    Args:
        eta_knob: The 0 <= η <= 1 knob of the cost.
        world_size: The number of GPUs in the training job.
    """

    def __init__(self, eta_knob: float, world_size: int = 1) -> None:
        self.eta_knob = check_eta_knob(eta_knob)
        if not isinstance(world_size, int) or world_size < 1:
            raise ZeusConfigError(f"world_size must be an integer >= 1, got {world_size!r}.")
        self.world_size = world_size

    def select(self, measurements: list[PowerLimitMeasurement]) -> int:
        _check_measurements(measurements)
        max_power_w = max(m.power_limit_w for m in measurements) * self.world_size
        return min(
            measurements,
            key=lambda m: (
                zeus_cost(m.energy_j, m.time_s, self.eta_knob, max_power_w),
                m.power_limit_w,
            ),
        ).power_limit_w


class MaxSlowdownConstraint(OptimumSelector):
    """Selects the lowest power limit whose time is at most `factor` × the time at the max limit.

    Args:
        factor: The maximum allowed slowdown factor, >= 1.
    """

    def __init__(self, factor: float) -> None:
        if not isinstance(factor, int | float) or not math.isfinite(factor) or factor < 1.0:
            raise ZeusConfigError(
                f"factor is the maximum allowed slowdown and must be >= 1.0, got {factor!r}."
            )
        self.factor = float(factor)

    def select(self, measurements: list[PowerLimitMeasurement]) -> int:
        _check_measurements(measurements)
        reference = max(measurements, key=lambda m: m.power_limit_w)
        feasible = [
            m.power_limit_w for m in measurements if m.time_s <= self.factor * reference.time_s
        ]
        return min(feasible)  # The max limit itself is always feasible.
