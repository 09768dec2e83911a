"""`plan_problems`: the checks a chosen plan passes before it is deployed, on the guard's
statistic (issue 49: one statistic for guard, report, `/jobs` and tests)."""

from __future__ import annotations

from schedulers.checks import MAX_SPEEDUP_BELOW_MAX, plan_problems

STEADY = [100.0, 100.5, 99.5, 100.2, 99.8]


def test_one_disturbed_all_max_round_does_not_hold_a_measurable_plan():
    # A standard deviation would put this baseline's spread at 12 % (one round 30 % over)
    # and hold an 8 % saving as noise; the guard's robust spread is about 0.5 %.
    problems = plan_problems(
        predicted_saving=0.08, predicted_slowdown=0.005, baseline_energies_j=[*STEADY, 130.0]
    )
    assert problems == []


def test_a_saving_within_the_rounds_spread_is_held_as_noise():
    noisy = [100.0, 104.0, 96.0, 103.0, 97.0, 101.0, 99.0]
    problems = plan_problems(
        predicted_saving=0.03, predicted_slowdown=0.0, baseline_energies_j=noisy
    )
    assert len(problems) == 1 and "could not tell it from noise" in problems[0], problems


def test_the_spread_is_the_newest_windows():
    # Old, noisy all-max rounds (before the machine settled) age out of the window.
    old = [100.0, 110.0, 90.0, 108.0, 92.0] * 10
    problems = plan_problems(
        predicted_saving=0.03, predicted_slowdown=0.0, baseline_energies_j=old + STEADY * 4
    )
    assert problems == []


def test_a_plan_faster_than_all_max_is_noise():
    problems = plan_problems(
        predicted_saving=0.1,
        predicted_slowdown=-(MAX_SPEEDUP_BELOW_MAX + 0.01),
        baseline_energies_j=STEADY,
    )
    assert len(problems) == 1 and "faster than all-max" in problems[0], problems
