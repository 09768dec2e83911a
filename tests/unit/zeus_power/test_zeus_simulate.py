"""The trace-driven simulator: tables, oracle, determinism and the policy against the oracle."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from zeus_power.errors import ZeusConfigError
from zeus_power.metric import zeus_cost
from zeus_power.simulate import TraceTables, make_emulator_tables, oracle, simulate


@pytest.fixture(scope="module")
def tables() -> TraceTables:
    return make_emulator_tables(batch_sizes=(64, 128, 256, 512, 1024, 2048), num_seeds=4)


def test_emulator_tables_have_the_expected_shape(tables: TraceTables) -> None:
    assert tables.batch_sizes == [64, 128, 256, 512, 1024, 2048]
    assert tables.power_limits_w[0] == 300 and tables.power_limits_w[-1] == 100
    for bs in tables.batch_sizes:
        times = [tables.iteration(bs, pl).iter_time_s for pl in tables.power_limits_w]
        assert times == sorted(times)  # lower limit, slower iteration
        powers = [tables.iteration(bs, pl).iter_power_w for pl in tables.power_limits_w]
        assert powers == sorted(powers, reverse=True)  # a lower limit caps the power
        assert powers[0] <= 300.0
    assert all(tables.epochs_to_target(2048, s) is None for s in tables.seeds)  # too large


def test_tables_round_trip_as_json(tables: TraceTables) -> None:
    assert TraceTables.model_validate_json(tables.model_dump_json()) == tables
    # The emulator's tables say so; tables of real traces (no field) read as not emulated.
    assert tables.emulated and '"emulated":true' in tables.model_dump_json()
    real = tables.model_copy(update={"emulated": False})
    assert "emulated" not in real.model_dump_json()
    assert not TraceTables.model_validate_json(real.model_dump_json()).emulated


def test_incomplete_tables_are_rejected(tables: TraceTables) -> None:
    data = tables.model_dump()
    data["iterations"] = data["iterations"][1:]
    with pytest.raises(ValidationError, match="iteration rows missing"):
        TraceTables.model_validate(data)
    data = tables.model_dump()
    data["default_batch_size"] = 48
    with pytest.raises(ValidationError, match="default_batch_size=48"):
        TraceTables.model_validate(data)


def test_oracle_is_the_cheapest_feasible_fixed_choice(tables: TraceTables) -> None:
    seeds = [0, 1, 2, 3, 0]
    best = oracle(tables, seeds, 0.5)
    for bs in tables.batch_sizes:
        if any(tables.epochs_to_target(bs, s) is None for s in seeds):
            continue
        for pl in tables.power_limits_w:
            time_s, energy_j = tables.epoch(bs, pl)
            cost = sum(tables.epochs_to_target(bs, s) for s in seeds) * zeus_cost(
                energy_j, time_s, 0.5, 300.0
            )
            assert best.total_cost <= cost * (1 + 1e-12)
    assert best.batch_size != 2048


def test_simulation_is_deterministic_and_accounts_every_trial(tables: TraceTables) -> None:
    a = simulate(tables, num_recurrences=30, seed=3)
    b = simulate(tables, num_recurrences=30, seed=3)
    assert a.history == b.history and a.total_cost == b.total_cost
    assert a.total_cost == pytest.approx(sum(h.cost for h in a.history))
    assert [h.rec_i for h in a.history if h.reached] == list(range(1, 31))
    assert all(not h.reached for h in a.history if h.batch_size == 2048)
    assert all(h.emulated for h in a.history)  # replayed from the emulator's tables


def test_policy_approaches_the_oracle_and_beats_the_default(tables: TraceTables) -> None:
    result = simulate(tables, num_recurrences=60, seed=0)
    assert result.default_cost is not None
    assert result.total_cost < result.default_cost
    late = [h for h in result.history if h.rec_i > 40]
    assert {h.batch_size for h in late} == {result.oracle.batch_size}  # exploits the best
    assert {h.power_limit_w for h in late} == {result.oracle.power_limit_w}


def test_energy_only_cost_lowers_the_power_limit(tables: TraceTables) -> None:
    time_first = simulate(tables, num_recurrences=20, eta_knob=0.0)
    energy_first = simulate(tables, num_recurrences=20, eta_knob=1.0)
    assert time_first.oracle.power_limit_w > energy_first.oracle.power_limit_w
    last = energy_first.history[-1]
    assert last.power_limit_w < 300


def test_bad_simulation_arguments(tables: TraceTables) -> None:
    with pytest.raises(ZeusConfigError, match="eta_knob"):
        simulate(tables, num_recurrences=5, eta_knob=-1)
    with pytest.raises(ZeusConfigError, match="num_recurrences=0"):
        simulate(tables, num_recurrences=0)
