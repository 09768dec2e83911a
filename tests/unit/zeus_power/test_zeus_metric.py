"""zeus_cost and the cost-threshold error."""

from __future__ import annotations

import math

import pytest

from zeus_power.errors import ZeusConfigError, ZeusCostThresholdExceededError, ZeusError
from zeus_power.metric import check_eta_knob, zeus_cost


@pytest.mark.parametrize(
    ("energy", "time", "eta", "max_power", "expected"),
    [
        (1000.0, 10.0, 1.0, 300.0, 1000.0),  # energy only
        (1000.0, 10.0, 0.0, 300.0, 3000.0),  # time only, in joules at max power
        (1000.0, 10.0, 0.5, 300.0, 0.5 * 1000.0 + 0.5 * 300.0 * 10.0),
        (0.0, 0.0, 0.3, 250.0, 0.0),
    ],
)
def test_zeus_cost_is_the_eta_weighted_sum(energy, time, eta, max_power, expected) -> None:
    assert zeus_cost(energy, time, eta, max_power) == pytest.approx(expected)


def test_zeus_cost_trades_energy_for_time_as_eta_moves() -> None:
    # A slow frugal run against a fast hungry one: the cheaper one flips with eta.
    slow = (800.0, 20.0)
    fast = (1500.0, 8.0)
    assert zeus_cost(*slow, 1.0, 300.0) < zeus_cost(*fast, 1.0, 300.0)
    assert zeus_cost(*slow, 0.0, 300.0) > zeus_cost(*fast, 0.0, 300.0)


@pytest.mark.parametrize("eta", [-0.01, 1.01, math.nan, "0.5"])
def test_check_eta_knob_rejects_values_outside_unit_interval(eta) -> None:
    with pytest.raises(ZeusConfigError, match="eta_knob"):
        check_eta_knob(eta)


def test_zeus_cost_rejects_nan() -> None:
    with pytest.raises(ZeusConfigError, match="NaN"):
        zeus_cost(math.nan, 1.0, 0.5, 300.0)


def test_threshold_error_carries_its_context() -> None:
    err = ZeusCostThresholdExceededError(10.0, 2000.0, 2500.0, 2750.0, 2600.0)
    assert isinstance(err, ZeusError)
    assert (err.time_consumed, err.energy_consumed, err.cost, err.next_cost, err.cost_thresh) == (
        10.0,
        2000.0,
        2500.0,
        2750.0,
        2600.0,
    )
    assert "2750.000" in str(err) and "2600.000" in str(err)
