"""Re-scoring the frontier when a deployed plan ran slower than its model said
(`perseus.schedulers.perseus_scheduler.costs.rescore_faster`, the guard's "move")."""

from __future__ import annotations

from perseus.domain.profile import InstructionProfile
from perseus.domain.schedule import make_schedule
from perseus.planning import all_max_plan, make_plan, solve_frontier
from perseus.schedulers.perseus_scheduler.costs import CostModel, rescore_faster
from perseus.synth import stage_workloads, synthesize_profile

GPU = "A100-SXM"
P2P_W = 60.0


def _setup():
    workloads = stage_workloads(GPU, [1.0, 1.6, 1.0, 1.2], base_forward_ms=10.0)
    profile = InstructionProfile.from_frame(
        synthesize_profile(GPU, workloads, min_freq_mhz=900), source="synth"
    )
    schedule = make_schedule("1f1b", 4, 8)
    costs = CostModel(0.015, "measured", 0.001, "calibrated")
    frontier = solve_frontier(
        profile, schedule, p2p_power_w=P2P_W, switch_latency_s=0.015, hop_latency_s=0.001
    )
    return profile, schedule, costs, frontier


def _scored(profile, schedule, costs, freqs):
    return make_plan(
        profile,
        schedule,
        freqs,
        P2P_W,
        switch_latency_s=costs.switch_latency_s,
        hop_latency_s=costs.hop_latency_s,
    )


def test_a_move_is_within_the_budget_of_the_models_all_max_too():
    profile, schedule, costs, frontier = _setup()
    chosen = _scored(profile, schedule, costs, frontier.choose(max_slowdown=0.05).frequencies)
    candidates = [p.frequencies for p in frontier.points]
    # The plan ran 3 % slower than its model; the measured all-max rounds ran slower still,
    # so the measured limit alone lets through plans beyond the budget of the model's all-max.
    measured_s = 1.03 * chosen.iteration_time
    limit_s = 1.2 * chosen.iteration_time
    loose, new = rescore_faster(
        profile, schedule, P2P_W, costs, chosen=chosen, candidates=candidates,
        measured_time_s=measured_s, limit_s=limit_s,
    )  # fmt: skip
    assert loose is not None and new.hop_latency_s > costs.hop_latency_s
    base = all_max_plan(
        profile, schedule, P2P_W, switch_latency_s=new.switch_latency_s,
        hop_latency_s=new.hop_latency_s,
    )  # fmt: skip
    assert loose.iteration_time > 1.01 * base.iteration_time
    bound, same = rescore_faster(
        profile, schedule, P2P_W, costs, chosen=chosen, candidates=candidates,
        measured_time_s=measured_s, limit_s=limit_s, max_slowdown=0.01,
    )  # fmt: skip
    assert same == new
    assert bound is not None and bound.iteration_time <= 1.01 * base.iteration_time
    # The cheapest such candidate: no re-scored candidate within both bounds is cheaper.
    now_s = _scored(profile, schedule, new, chosen.stage_frequencies()).iteration_time
    rescored = [_scored(profile, schedule, new, f) for f in candidates]
    within = [p for p in rescored if p.iteration_time <= min(1.01 * base.iteration_time, now_s)]
    assert bound.energy == min(p.energy for p in within)


def test_a_plan_chosen_after_the_costs_changed_is_within_the_budget_as_rescored():
    from dataclasses import replace

    from perseus.schedulers.perseus_scheduler.plan_model import PlanModel

    profile, schedule, costs, frontier = _setup()
    model = PlanModel("job", schedule, profile, P2P_W, costs, frontier)
    first = model.choose(max_slowdown=0.01)
    assert model.predicted(first)[1] <= 0.01 + 1e-9
    # The guard re-calibrated the hop latency on a deployed plan (a move): the frontier's
    # own choice, re-scored, is now beyond the budget of the re-scored all-max.
    model.costs = replace(costs, hop_latency_s=0.002)
    stale = model.plan_of(frontier.choose(max_slowdown=0.01).frequencies)
    assert model.predicted(stale)[1] > 0.01
    again = model.choose(max_slowdown=0.01)
    saving, slowdown = model.predicted(again)
    assert slowdown <= 0.01 + 1e-9 and saving > 0
    rescored = [model.plan_of(p.frequencies) for p in frontier.points]
    limit = 1.01 * model.all_max().iteration_time
    assert again.energy == min(p.energy for p in rescored if p.iteration_time <= limit)
    # Costs under which no frontier point is within the budget any more: all-max.
    model.costs = replace(costs, hop_latency_s=0.004)
    assert model.choose(max_slowdown=0.01).frequencies == model.all_max().frequencies


def test_all_max_is_no_move():
    """When the only candidate fast enough is all-max's clocks (a CI run's DeepSpeed job,
    whose re-calibrated hop latency left no slower point within its budget), there is no
    move: the guard falls back instead, and re-deploys after its cool-down."""
    profile, schedule, costs, frontier = _setup()
    chosen = _scored(profile, schedule, costs, frontier.choose(max_slowdown=0.05).frequencies)
    top = all_max_plan(profile, schedule, P2P_W).stage_frequencies()
    measured_s = 1.03 * chosen.iteration_time
    plan, same = rescore_faster(
        profile, schedule, P2P_W, costs, chosen=chosen, candidates=[top],
        measured_time_s=measured_s, limit_s=1.2 * chosen.iteration_time,
    )  # fmt: skip
    assert plan is None and same == costs
    # With a candidate that saves, that one is the move.
    middle = frontier.choose(max_slowdown=0.01).frequencies
    plan, new = rescore_faster(
        profile, schedule, P2P_W, costs, chosen=chosen, candidates=[top, middle],
        measured_time_s=measured_s, limit_s=1.2 * chosen.iteration_time,
    )  # fmt: skip
    assert plan is not None and plan.stage_frequencies() == middle
    assert new.hop_latency_s > costs.hop_latency_s
