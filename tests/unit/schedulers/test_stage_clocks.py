"""Per-stage constant clocks (`perseus.schedulers.perseus_scheduler.stage_clocks`): the levels and rounds, the fit of
each stage's time ratio and busy power, and the search over one clock per stage.

The fit and the search are fed a synthetic 4-stage pipeline of uneven stages whose truth is
known: every stage's busy time stretches as ``(f_max / f)^0.8`` and its busy power falls
with the clock; the rounds are what `StageClockSweep` would measure of it (busy time and
energy per iteration, the iteration time), with a little noise.
"""

from __future__ import annotations

import numpy as np
import pytest

from perseus.domain.schedule import make_schedule
from perseus.planning import PipelineProblem, evaluate
from perseus.schedulers.perseus_scheduler import stage_clocks
from perseus.schedulers.perseus_scheduler.stage_clocks import (
    StageSample,
    fit_stage_curves,
    fit_time_sensitivity,
    round_levels,
    stage_clock_frontier,
    stage_levels,
    stage_profile,
)

A100_CLOCKS = list(range(1410, 210 - 1, -15))
S, M = 4, 8
WORK = (0.5, 1.0, 0.7, 0.35)  # stage 1 the heaviest; forward ms at the max clock
P_BLOCK = 60.0
SCHEDULE = make_schedule("1f1b", S, M)


def stretch(f: int) -> float:
    return (1410 / f) ** 0.8


def busy_power(f: int) -> float:
    return 80.0 + 240.0 * (f / 1410) ** 2


def samples(
    levels: list[int],
    *,
    repeats: int = 3,
    noise: float = 0.005,
    seed: int = 0,
    flat: int | None = None,
) -> list[StageSample]:
    """What the sweep's rounds would measure of the synthetic pipeline (`flat`: a stage
    whose busy time does not grow at lower clocks, but falls a little: noise)."""
    rng = np.random.default_rng(seed)
    out = []
    for r_levels in round_levels(S, len(levels), repeats):
        freqs = [levels[k] for k in r_levels]
        busy, energy = [], []
        for s, f in enumerate(freqs):
            base = M * 3 * WORK[s] / 1000  # a forward and a backward twice as long
            ratio = (1.0 - 0.01 * (1410 - f) / 600) if s == flat else stretch(f)
            busy.append(base * ratio * (1 + noise * rng.standard_normal()))
        iteration = max(busy) * 1.3
        for s, f in enumerate(freqs):
            e = busy[s] * busy_power(f) + P_BLOCK * (iteration - busy[s])
            energy.append(e * (1 + noise * rng.standard_normal()))
        out.append(StageSample(tuple(freqs), tuple(busy), tuple(energy), iteration))
    return out


def profile_of(curves):
    max_times = {}
    for stage in range(S):
        max_times[stage, "forward"] = WORK[stage] / 1000
        max_times[stage, "backward"] = 2 * WORK[stage] / 1000
    ranks = [(s, 0, s, 0) for s in range(S)]
    return stage_profile(max_times, curves, SCHEDULE, ranks=ranks, emulated=True, source="test")


def true_profile(levels):
    curves = fit_stage_curves(samples(levels, noise=0.0), levels, p2p_power_w=P_BLOCK, time_z=0)
    return profile_of(curves)


# ---------------------------------------------------------------------- levels and rounds
def test_levels_span_the_max_clock_down_to_the_floor_from_supported_clocks():
    levels = stage_levels(A100_CLOCKS)
    assert levels[0] == 1410 and len(levels) == stage_clocks.LEVELS
    assert levels == sorted(levels, reverse=True) and len(set(levels)) == len(levels)
    assert set(levels) <= set(A100_CLOCKS)
    assert 0.55 * 1410 <= levels[-1] <= 0.62 * 1410
    assert stage_levels([1410, 1395]) == [1410, 1395]
    assert stage_levels([1410]) == [1410]


def test_every_stage_runs_every_level_in_each_repeat_and_rounds_mix_levels():
    rounds = round_levels(4, 6, 2)
    assert len(rounds) == 12
    for s in range(4):
        for repeat in (rounds[:6], rounds[6:]):
            assert sorted(r[s] for r in repeat) == list(range(6))
    assert all(len(set(r)) == 4 for r in rounds)  # never every stage at one clock


# ---------------------------------------------------------------------- the fit
def test_the_fit_recovers_each_stages_time_ratio_and_busy_power():
    levels = stage_levels(A100_CLOCKS)
    curves = fit_stage_curves(samples(levels), levels, p2p_power_w=P_BLOCK)
    for c in curves:
        assert c.freqs == levels
        assert c.time_ratio[0] == 1.0
        for f, r, p in zip(c.freqs, c.time_ratio, c.power_w, strict=True):
            assert r == pytest.approx(stretch(f), rel=0.02)
            assert p == pytest.approx(busy_power(f), rel=0.03)
        # The standard error was added: the ratios err on the slow side, never below.
        assert all(se > 0 for se in c.time_ratio_se[1:])


def test_a_stage_no_slower_at_lower_clocks_is_never_credited_with_speed():
    levels = stage_levels(A100_CLOCKS)
    curves = fit_stage_curves(samples(levels, flat=2), levels, p2p_power_w=P_BLOCK)
    flat = curves[2]
    assert all(r >= 1.0 for r in flat.time_ratio)
    assert flat.time_ratio == sorted(flat.time_ratio)  # never faster as the clock falls
    assert max(flat.time_ratio) < 1.02
    # Its rows in the profile are never faster than at the max clock.
    profile = profile_of(curves)
    for kind in ("forward", "backward"):
        o = profile.options(2, kind)
        top = float(o.time_s[o.freq_mhz.argmax()])
        assert float(o.time_s.min()) >= top


def test_a_power_below_the_gpus_idle_leaves_the_level_out():
    levels = stage_levels(A100_CLOCKS)
    floor = [busy_power(levels[3]) + 1.0, None, None, None]  # stage 0's three lowest levels
    curves = fit_stage_curves(samples(levels), levels, p2p_power_w=P_BLOCK, power_floor_w=floor)
    assert curves[0].freqs == levels[:3]
    assert len(curves[0].left_out) == 3 and "idle" in curves[0].left_out[0]
    assert curves[1].freqs == levels


def test_a_busy_power_above_the_limit_at_the_max_clock_is_named_not_dropped():
    """Stage 0's GPUs are capped below what its rounds read at the top two levels (the power
    drawn after work stops, charged to busy time, can do that): the lower one is left out,
    the max clock stays (all-max needs it) and says why, which keeps the job at all-max."""
    levels = stage_levels(A100_CLOCKS)
    cap = [busy_power(levels[2]) + 1.0, None, None, None]
    curves = fit_stage_curves(samples(levels), levels, p2p_power_w=P_BLOCK, power_cap_w=cap)
    assert curves[0].freqs == [levels[0], *levels[2:]]
    assert len(curves[0].left_out) == 1 and "limit" in curves[0].left_out[0]
    assert curves[0].unphysical_at_max is not None and "limit" in curves[0].unphysical_at_max
    assert all(c.unphysical_at_max is None for c in curves[1:])


def test_a_stage_never_measured_at_the_max_clock_keeps_only_the_max():
    levels = stage_levels(A100_CLOCKS)
    some = [x for x in samples(levels) if x.freqs[0] != levels[0]]
    curves = fit_stage_curves(some, levels, p2p_power_w=P_BLOCK)
    assert curves[0].freqs == [levels[0]] and curves[0].time_ratio == [1.0]
    assert curves[1].freqs[0] == levels[0] and len(curves[1].freqs) > 1


# ---------------------------------------------------------------------- the plans
@pytest.mark.parametrize("budget", [0.0, 0.01, 0.03, 0.1])
def test_light_stages_get_lower_clocks_the_heaviest_stays_and_the_budget_holds(budget):
    levels = stage_levels(A100_CLOCKS)
    curves = fit_stage_curves(samples(levels), levels, p2p_power_w=P_BLOCK)
    profile = profile_of(curves)
    frontier = stage_clock_frontier(
        profile,
        SCHEDULE,
        P_BLOCK,
        switch_latency_s=0.015,
        hop_latency_s=0.0002,
        max_slowdown=budget,
    )
    assert frontier.all_max is not None
    t_max = frontier.all_max.iteration_time_s
    point = frontier.choose(max_slowdown=budget)
    clocks = [set(f) for f in point.frequencies]
    assert all(len(c) == 1 for c in clocks)  # one clock per stage: no switch in an iteration
    clocks = [c.pop() for c in clocks]
    assert point.iteration_time_s <= (1 + budget) * t_max * (1 + 1e-9)
    if budget == 0.0:
        # 1F1B's fill and drain run through every stage: any lower clock costs time.
        assert clocks == [1410] * S
        return
    assert point.energy_j < frontier.all_max.energy_j
    if budget < 0.1:
        assert clocks[1] == 1410  # the heaviest stage sets the pace
    assert min(clocks[0], clocks[3]) < 1410  # the lightest have slack
    if budget >= 0.03:
        assert clocks[3] < 1410 and clocks[0] < 1410
    # The plan's numbers are the evaluator's (the job's accounting, switches included).
    ev = evaluate(
        profile,
        SCHEDULE,
        point.frequencies,
        P_BLOCK,
        switch_latency_s=0.015,
        hop_latency_s=0.0002,
    )
    assert ev.iteration_time_s == pytest.approx(point.iteration_time_s, rel=1e-9)
    assert ev.energy_j == pytest.approx(point.energy_j, rel=1e-9)
    # On the truth (no noise, no standard error added), the plan saves and keeps the budget.
    truth = true_profile(levels)
    true_plan = evaluate(truth, SCHEDULE, point.frequencies, P_BLOCK, hop_latency_s=0.0002)
    true_max = evaluate(
        truth, SCHEDULE, frontier.all_max.frequencies, P_BLOCK, hop_latency_s=0.0002
    )
    assert true_plan.energy_j < true_max.energy_j
    assert true_plan.iteration_time_s <= (1 + budget) * true_max.iteration_time_s * (1 + 1e-6)


def test_a_deadline_is_the_limit_when_given():
    levels = stage_levels(A100_CLOCKS)
    profile = profile_of(fit_stage_curves(samples(levels), levels, p2p_power_w=P_BLOCK))
    loose = stage_clock_frontier(
        profile, SCHEDULE, P_BLOCK, switch_latency_s=0.0, hop_latency_s=0.0, max_slowdown=0.0
    )
    deadline = 1.05 * loose.reference_time_s
    frontier = stage_clock_frontier(
        profile, SCHEDULE, P_BLOCK, switch_latency_s=0.0, hop_latency_s=0.0, deadline_s=deadline
    )
    point = frontier.choose(deadline_s=deadline)
    assert point.iteration_time_s <= deadline * (1 + 1e-9)
    assert point.energy_j < loose.choose(max_slowdown=0.0).energy_j


def test_the_greedy_search_comes_close_to_every_combination(monkeypatch):
    """Beyond `EXHAUSTIVE_PLANS` combinations the search is a greedy chain and a coordinate
    descent; on a pipeline small enough for both, it lands within 1 % of the best."""
    levels = stage_levels(A100_CLOCKS)
    profile = profile_of(fit_stage_curves(samples(levels), levels, p2p_power_w=P_BLOCK))
    kw = {"switch_latency_s": 0.0, "hop_latency_s": 0.0, "max_slowdown": 0.02}
    best = stage_clock_frontier(profile, SCHEDULE, P_BLOCK, **kw).choose(max_slowdown=0.02)
    monkeypatch.setattr(stage_clocks, "EXHAUSTIVE_PLANS", 0)
    greedy = stage_clock_frontier(profile, SCHEDULE, P_BLOCK, **kw)
    assert greedy.stats["plans_scored"] < 6**S
    point = greedy.choose(max_slowdown=0.02)
    assert point.iteration_time_s <= 1.02 * greedy.reference_time_s * (1 + 1e-9)
    assert point.energy_j <= best.energy_j * 1.01
    # The coordinate descent alone, from all-max, finds the best too.
    score = stage_clocks._Scorer(PipelineProblem(profile, SCHEDULE, P_BLOCK), None)
    (t_max,), _ = score([[0] * S])
    found = stage_clocks._descend(score, [0] * S, 1.02 * float(t_max))
    (_,), (energy,) = score([found])
    assert energy <= best.energy_j * 1.005
    assert found != [0] * S


def test_a_stage_whose_host_is_busy_is_charged_the_time_the_rounds_measured():
    """The rounds' median iteration grew by all of stage 0's added busy time (its rank had
    no slack: a busy host between instructions) though the DAG gives it slack: the fit
    says so, and the plans are scored with it, so stage 0 is no longer free to slow."""
    levels = stage_levels(A100_CLOCKS)
    plain = samples(levels, noise=0.0)
    base = tuple(M * 3 * w / 1000 for w in WORK)
    top = [StageSample((levels[0],) * S, base, (1.0,) * S, 0.05)] * 3  # the all-max rounds
    t0 = 0.05
    measured = [
        StageSample(
            x.freqs, x.busy_s, x.energy_j, x.iteration_s, typical_s=t0 + x.busy_s[0] - base[0]
        )
        for x in plain
    ]
    measured += [
        StageSample(x.freqs, x.busy_s, x.energy_j, x.iteration_s, typical_s=t0) for x in top
    ]
    sensitivity = fit_time_sensitivity(measured)
    assert sensitivity is not None
    assert sensitivity[0] == pytest.approx(1.0, abs=0.02)
    assert max(sensitivity[1:]) < 0.02
    profile = profile_of(fit_stage_curves(plain, levels, p2p_power_w=P_BLOCK, time_z=0))
    kw = {"switch_latency_s": 0.0, "hop_latency_s": 0.0, "max_slowdown": 0.01}
    free = stage_clock_frontier(profile, SCHEDULE, P_BLOCK, **kw).choose(max_slowdown=0.01)
    assert free.frequencies[0][0] < 1410  # the DAG's slack alone lets stage 0 slow down
    busy = stage_clock_frontier(profile, SCHEDULE, P_BLOCK, sensitivity=sensitivity, **kw)
    point = busy.choose(max_slowdown=0.01)
    # Stage 0's added busy time at its clock fits within 1 % of all-max: no more.
    added = base[0] * (stretch(point.frequencies[0][0]) - 1)
    assert added <= 0.01 * busy.reference_time_s * (1 + 1e-6)
    assert point.iteration_time_s <= 1.01 * busy.reference_time_s * (1 + 1e-9)
    assert point.frequencies[0][0] > free.frequencies[0][0]
    assert fit_time_sensitivity(measured[:3]) is None  # too few rounds to tell
