"""The promise guard's decisions on measured rounds (`perseus.schedulers.perseus_scheduler.guard`), and what keeps it
fit to be left running for weeks (issue 49): a robust spread, a capped tolerance, a
fall-back that cools down and re-deploys, bounded windows, a state that survives a restart."""

from __future__ import annotations

import json
import math
import time

import pytest

from perseus.domain.plan import Plan
from perseus.domain.robust import MAD_SCALE, ROUND_WINDOW, robust_spread
from perseus.schedulers.perseus_scheduler.args import PerseusArgs
from perseus.schedulers.perseus_scheduler.guard import (
    COOLDOWN_ROUNDS,
    MAX_COOLDOWN_ROUNDS,
    SLOWDOWN_TOLERANCE_FLOOR,
    GuardState,
    PromiseGuard,
    RoundFigures,
    relative_spread,
)
from perseus.schedulers.perseus_scheduler.promise import GUARD_STATE_VERSION, Promise
from perseus.schedulers.perseus_scheduler.story import MAX_EVENTS

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
    g = guard(budget=0.05)  # a budget whose cap (5.5 %) is above this tolerance
    sigma = relative_spread(BASE_T)
    assert sigma == pytest.approx(MAD_SCALE * 0.005)  # 1.4826 × the median |deviation|
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


def test_over_budget_moves_faster_once_then_falls_back_to_all_max_for_a_cool_down():
    g = guard()
    g.watch(0.009)
    (d1,) = feed(g, 1.06, 90.0, 5)
    assert d1.move == "faster" and "over the 1.00% budget" in d1.reason
    g.watch(0.005)  # the faster plan
    (d2,) = feed(g, 1.05, 91.0, 5, start=20)
    assert d2.move == "all-max"
    assert g.state is GuardState.COOLING and g.cooldown_left == COOLDOWN_ROUNDS
    assert feed(g, 1.2, 200.0, 20, start=30) == []  # no plan runs: nothing to check


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


# ---------------------------------------------------------------- issue 49: robust, capped


def test_one_disturbed_all_max_round_does_not_widen_the_tolerance():
    """A host stall in one of the five all-max rounds (30 % slow) widened the old standard
    deviation's tolerance to ~34 %: a plan measured at +5 % under a 1 % budget was kept."""
    quiet = [1.0, 1.001, 0.999, 1.0005]
    g = PromiseGuard(budget=0.01, window=4, z=3.0)
    for k, t in enumerate([*quiet, 1.30]):
        g.add_baseline(RoundFigures(k, t, 100.0 + k % 2))
    tol_t, _ = g.tolerances(4)
    assert tol_t < 0.005  # the quiet rounds' spread, not the stall's
    assert robust_spread([*quiet, 1.30]) < 0.002
    g.watch(0.009)
    (d,) = feed(g, 1.05, 90.0, 5)
    assert d.move == "faster", d.reason


def test_the_slowdown_tolerance_never_exceeds_the_budget_plus_the_floor():
    """All-max rounds 5 % apart (a noisy job): the tolerance is capped at budget + 0.5 pt,
    so a plan measured at +5 % under a 1 % budget moves (the issue's 4.02 % would keep it)."""
    g = PromiseGuard(budget=0.01, window=4, z=3.0)
    for k, t in enumerate([1.0, 1.05, 0.95, 1.1, 0.9, 1.02, 0.98]):
        g.add_baseline(RoundFigures(k, t, 100.0 * t))
    assert 3.0 * relative_spread([r.iteration_time_s for r in g.baseline]) > 0.05
    tol_t, tol_e = g.tolerances(4)
    assert tol_t == pytest.approx(0.01 + SLOWDOWN_TOLERANCE_FLOOR)
    assert tol_e > tol_t  # the energy tolerance is not capped: it only delays a fall-back
    g.watch(0.009)
    (d,) = feed(g, 1.0 * 1.05, 80.0, 5)
    assert d.move == "faster" and d.slowdown_tolerance <= 0.015 + 1e-12
    zero = PromiseGuard(budget=0.0)
    for k, t in enumerate([1.0, 1.05, 0.95]):
        zero.add_baseline(RoundFigures(k, t, 100.0))
    assert zero.tolerances(4)[0] == pytest.approx(SLOWDOWN_TOLERANCE_FLOOR)


# ---------------------------------------------------------------- issue 49: not for life


def _cool_down(g: PromiseGuard, start: int) -> int:
    """Feed all-max rounds until the cool-down ends; returns how many it took."""
    n = 0
    while True:
        n += 1
        assert n <= MAX_COOLDOWN_ROUNDS + 1
        if g.cool(RoundFigures(start + n, 1.0 + 0.001 * (n % 3), 100.0 + 0.1 * (n % 3))):
            return n


def test_a_fall_back_cools_down_then_re_deploys_with_a_doubling_capped_back_off():
    g = guard()
    g.watch(0.0)
    (d,) = feed(g, 1.0, 110.0, 5)  # more energy than all-max: a fall-back, not for life
    assert d.move == "all-max" and g.cooling
    lengths = []
    for cycle in range(12):
        lengths.append(_cool_down(g, 1000 * (cycle + 1)))
        assert g.redeploy_problem(predicted_saving=0.08) is None
        g.redeploy(predicted_slowdown=0.005)
        assert g.state is GuardState.SETTLING and g.moves == 0
        (d,) = feed(g, 1.0, 110.0, 5, start=1000 * (cycle + 1) + 500)
        assert d.move == "all-max"  # fails again: a longer cool-down
    assert lengths[:4] == [COOLDOWN_ROUNDS * 2**k for k in range(4)]
    assert max(lengths) == MAX_COOLDOWN_ROUNDS == lengths[-1]
    # The cool-down's all-max rounds are fresh baseline rounds (but its first, a switch).
    assert all(r.round > 11000 for r in g.baseline)


def test_a_plan_kept_long_enough_resets_the_back_off():
    g = guard()
    g.watch(0.0)
    feed(g, 1.0, 110.0, 5)
    for _ in range(3):
        _cool_down(g, 0)
        g.redeploy(0.005)
        feed(g, 1.0, 110.0, 5, start=100)
    assert g.fallbacks == 4
    _cool_down(g, 0)
    g.redeploy(0.005)
    feed(g, 1.005, 92.0, MAX_COOLDOWN_ROUNDS + 5, start=200)  # kept for hours
    assert g.state is GuardState.KEPT and g.fallbacks == 0
    feed(g, 1.0, 110.0, 4, start=10**6)
    assert g.cooling and g.cooldown_left == COOLDOWN_ROUNDS


def test_a_re_deployment_the_fresh_rounds_cannot_check_is_declined_and_cools_longer():
    g = guard()
    g.watch(0.0)
    feed(g, 1.0, 110.0, 5)
    for k in range(COOLDOWN_ROUNDS):  # a job whose energy now swings ±5 % round to round
        g.cool(RoundFigures(100 + k, 1.0, 100.0 * (1.05 if k % 2 else 0.95)))
    problem = g.redeploy_problem(predicted_saving=0.03)
    assert problem is not None and "3.00%" in problem
    assert g.cool_longer() == 2 * COOLDOWN_ROUNDS and g.cooling
    assert g.redeploy_problem(predicted_saving=0.5) is None


def test_a_hold_before_deployment_stays_a_hold():
    g = guard()
    g.hold()
    assert g.state is GuardState.ALL_MAX and not g.cooling
    assert not any(g.cool(RoundFigures(k, 1.0, 100.0)) for k in range(10 * COOLDOWN_ROUNDS))


# ---------------------------------------------------------------- issue 49: bounded, persisted


def _promise(tmp_path, **args) -> Promise:
    def predict(plan: Plan) -> tuple[float, float]:
        return 0.08, 0.005

    return Promise(
        "job",
        tmp_path / "promise.jsonl",
        PerseusArgs(max_slowdown=0.01, **args),
        predict,
        state_path=tmp_path / "guard.json",
    )


def test_every_history_is_a_bounded_window_over_100k_rounds(tmp_path):
    p = _promise(tmp_path)
    g = p.guard
    g.watch(0.005)
    started = time.perf_counter()
    for k in range(100_000):
        figures = RoundFigures(k, 1.0 + 1e-4 * (k % 7), 92.0 + 0.01 * (k % 5))
        if k % 10 == 9:
            p.add_baseline(RoundFigures(k, 1.0 + 1e-4 * (k % 3), 100.0 + 0.01 * (k % 3)))
        else:
            p.plan_rounds.append(figures)
            g.observe(figures)
        if k % 1000 == 0:
            p.story.record({"round": k, "event": "check", "reason": "kept"})
        p.story.note("a note")
    elapsed = time.perf_counter() - started
    assert len(p.baseline) == len(g.baseline) == ROUND_WINDOW
    assert len(p.plan_rounds) == ROUND_WINDOW
    assert len(g._rounds) <= g._rounds.maxlen <= 3 * g.window
    assert len(p.story.take_notes()) <= 100 and len(p.story._events) <= MAX_EVENTS
    assert g.state is GuardState.KEPT
    assert elapsed < 60, elapsed  # ~2 s here: nothing re-sorts a growing list per round


def test_the_guard_state_is_saved_atomically_and_read_back(tmp_path):
    p = _promise(tmp_path)
    for k in range(30):
        p.add_baseline(RoundFigures(k, 1.0 + 1e-3 * (k % 3), 100.0 + k % 2))
    p.guard.watch(0.005)
    feed(p.guard, 1.0, 110.0, 5, start=40)  # falls back
    assert p.guard.cooling
    p.save(45, force=True)
    saved = json.loads((tmp_path / "guard.json").read_text())
    assert saved["version"] == GUARD_STATE_VERSION and saved["round"] == 45
    assert len(saved["guard"]["baseline"]) == ROUND_WINDOW  # bounded
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".guard")] == []
    p.save(46)  # not forced, within SAVE_EVERY rounds: not written
    assert json.loads((tmp_path / "guard.json").read_text())["round"] == 45
    again = _promise(tmp_path)
    state = again.load()
    assert state is not None
    again.guard.restore(state["guard"])
    assert again.guard.cooling and again.guard.fallbacks == 1
    assert again.guard.cooldown_left == p.guard.cooldown_left
    assert list(again.guard.baseline) == list(p.guard.baseline)
    (tmp_path / "guard.json").write_text('{"version": 0}')
    assert _promise(tmp_path).load() is None  # another layout: the guard starts afresh
    (tmp_path / "guard.json").unlink()
    assert _promise(tmp_path).load() is None
