"""Zeus's energy-time cost metric.

cost = η · energy + (1 − η) · max_power · time

`η = 1` optimises energy only, `η = 0` time only; `max_power · time` turns time into
joules so that both terms share a unit.
"""

from __future__ import annotations

import math

from zeus_power.errors import ZeusConfigError, ZeusCostThresholdExceededError

__all__ = ["ZeusCostThresholdExceededError", "check_eta_knob", "zeus_cost"]


def check_eta_knob(eta_knob: float) -> float:
    """Return `eta_knob` if it lies in [0, 1]; else raise `ZeusConfigError` naming it."""
    if not isinstance(eta_knob, int | float) or not 0.0 <= eta_knob <= 1.0:
        raise ZeusConfigError(f"eta_knob must be a number in [0, 1], got {eta_knob!r}.")
    return float(eta_knob)


def zeus_cost(energy: float, time: float, eta_knob: float, max_power: float) -> float:
    """Compute Zeus's energy-time cost metric.

    The caller is expected to check `eta_knob` (see `check_eta_knob`), because it
    rarely changes; this function only computes.

    Args:
        energy: Energy in joules.
        time: Time in seconds.
        eta_knob: Real number in [0, 1].
        max_power: The maximum power limit of the GPUs in watts (summed over GPUs when
            `energy` is summed over GPUs).

    Returns:
        The cost, in joules.
    """
    cost = eta_knob * energy + (1.0 - eta_knob) * max_power * time
    if math.isnan(cost):
        raise ZeusConfigError(
            f"zeus_cost is NaN for energy={energy!r}, time={time!r}, eta_knob={eta_knob!r},"
            f" max_power={max_power!r}; pass finite numbers."
        )
    return cost
