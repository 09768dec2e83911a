"""The promise guard's decisions on measured rounds (`schedulers.guard`)."""

from __future__ import annotations

import math

import pytest

from schedulers.guard import GuardState, PromiseGuard, RoundFigures, relative_spread

# All-max rounds with a 1 % round-to-round spread in time and energy.
BASE_T = [1.00, 1.01, 0.99, 1.005, 0.995]
BASE_E = [100.0, 101.0, 99.0, 100.5, 99.5]


def guard(budget: float = 0.01, **kw) -> PromiseGuard:
    g = PromiseGuard(budget=budget, window=4, z=3.0, **kw)
    for k, (t, e) in enumerate(zip(BASE_T, BASE_E, strict=True)):
        g.add_baseline(RoundFigures(k, t, e))
    return g


def feed(g: PromiseGuard, t: float, e: float, rounds: int, start: int = 10):
    decisions = []
    for k in range(rounds):
        d = g.observe(RoundFigures(start + k, t, e))
        if d is not None:
            decisions.append(d)
    return decisions


def test_tolerance_comes_from_the_baselines_spread_and_shrinks_with_more_rounds():
    g = guard()
    sigma = relative_spread(BASE_T)
    tol4, _ = g.tolerances(4)
    tol16, _ = g.tolerances(16)
    assert tol4 == pytest.approx(3.0 * sigma * 1.2533 * math.sqrt(1 / 5 + 1 / 4))
    assert tol16 < tol4
    quiet = PromiseGuard(budget=0.01)
    quiet.add_baseline(RoundFigures(0, 1.0, 100.0))
    quiet.add_baseline(RoundFigures(1, 1.0, 100.0))
    assert quiet.tolerances(4)[0] > 0  # never below the resolution floor


def test_a_plan_within_budget_that_saves_is_kept_after_one_settling_round():
    g = guard()
    g.watch(predicted_slowdown=0.008)
    (d,) = feed(g, 1.008, 92.0, 1 + 4)
    assert d.move is None and "keeps" in d.reason
    assert g.state is GuardState.KEPT
    assert d.rounds == (11, 14)  # the settling round is not measured
    assert d.measured_saving == pytest.approx(0.08)


def test_over_budget_moves_faster_once_then_to_all_max_and_stays_there():
    g = guard()
    g.watch(0.009)
    (d1,) = feed(g, 1.06, 90.0, 5)
    assert d1.move == "faster" and "over the 1.00% budget" in d1.reason
    g.watch(0.005)  # the faster plan
    (d2,) = feed(g, 1.05, 91.0, 5, start=20)
    assert d2.move == "all-max"
    assert g.state is GuardState.ALL_MAX
    assert feed(g, 1.2, 200.0, 20, start=30) == []  # terminal: no more moves


def test_a_slowdown_inside_the_tolerance_is_not_a_violation():
    g = guard()
    tol, _ = g.tolerances(4)
    g.watch(0.01)
    (d,) = feed(g, 1.0 * (1 + 0.01 + 0.5 * tol), 95.0, 5)
    assert d.move is None


def test_more_energy_than_all_max_falls_back_at_once():
    g = guard()
    g.watch(0.0)
    (d,) = feed(g, 1.0, 110.0, 5)
    assert d.move == "all-max" and "above all-max" in d.reason


def test_a_saving_lost_in_noise_is_measured_longer_then_given_up():
    g = guard()
    g.watch(0.0)
    decisions = feed(g, 1.0, 100.0, 1 + 4 * 6)
    moves = [d.move for d in decisions]
    assert moves == [None, None, "all-max"], moves
    assert "cannot be told from noise" in decisions[-1].reason


def test_a_kept_plan_is_still_checked_and_never_oscillates():
    g = guard()
    g.watch(0.005)
    feed(g, 1.005, 92.0, 5)
    assert g.state is GuardState.KEPT
    # Later the job drifts over budget: the kept plan moves, and only towards faster plans.
    decisions = feed(g, 1.05, 92.0, 8, start=40)
    assert [d.move for d in decisions] == ["faster"]
