"""P2P hop latency in the planning layer: switching and hops counted together against an
independent replay on emulated GPUs, calibration through the solver's lagged scoring,
the problem cache, plan files and frontiers that carry their hop latency."""

from __future__ import annotations

import json

import pytest

from perseus.domain.plan import Plan
from perseus.domain.profile import InstructionProfile
from perseus.domain.schedule import make_schedule
from perseus.errors import PlanError, SolverError
from perseus.io.plan_file import load_plan, save_plan
from perseus.planning import (
    Frontier,
    calibrate_hop_latency,
    evaluate,
    evaluate_plan,
    hop_times,
    make_plan,
    max_frequencies,
    pipeline_problem,
    solve_frontier,
)
from perseus.synth import stage_workloads, synthesize_profile
from zeus_power.device.emulated import EmulatedGPU, VirtualClock

GPU = "A40"
P2P = 70.38
HOP = 0.004
SWITCH = 0.015


@pytest.fixture(scope="module")
def setup():
    workloads = stage_workloads(GPU, [1.0, 1.3, 0.9], base_forward_ms=8.0)
    frame = synthesize_profile(GPU, workloads, min_freq_mhz=1200)
    profile = InstructionProfile.from_frame(frame, source="synth")
    wl = [{False: f, True: b} for f, b in workloads]
    return profile, wl, make_schedule("1f1b", 3, 4)


def _replay(schedule, workloads, frequencies, switch_latency_s, hop_latency_s):
    """The plan run twice on emulated GPUs (virtual time) that switch clocks in
    `switch_latency_s`, each hop between ranks taking `hop_latency_s`: (time, energy) of the
    second iteration. Independent of the planner's arithmetic."""
    clocks = [VirtualClock() for _ in schedule.orders]
    gpus = [
        # Ideal sensors: one iteration's energy against the plan's, to the mJ.
        EmulatedGPU(r, gpu_type=GPU, clock=c, switch_latency_s=switch_latency_s, sensors="ideal")
        for r, c in enumerate(clocks)
    ]
    position = {ins: k for order in schedule.orders for k, ins in enumerate(order)}
    dag, begin = schedule.dag(), 0.0
    for _ in range(2):
        start_mj = [g.total_energy_mj() for g in gpus]
        finish = {}
        for ins in schedule.instructions():
            s = max(
                (
                    finish[p] + (hop_latency_s if p.rank != ins.rank else 0.0)
                    for p in dag.predecessors(ins)
                ),
                default=begin,
            )
            gpu, clock = gpus[ins.rank], clocks[ins.rank]
            if s > clock():
                gpu.record_busy(s - clock(), P2P)
                clock.advance(s - clock())
            f = frequencies[ins.rank][position[ins]]
            gpu.lock_sm_clocks(f, f)
            finish[ins] = s + gpu.execute(workloads[ins.stage][ins.kind == "backward"]).time_s
        end = max(finish.values())
        for gpu, clock in zip(gpus, clocks, strict=True):
            if end > clock():
                gpu.record_busy(end - clock(), P2P)
                clock.advance(end - clock())
        energy = sum(g.total_energy_mj() - e for g, e in zip(gpus, start_mj, strict=True)) / 1e3
        result, begin = (end - begin, energy), end
    return result


def _changing_plan(schedule):
    pattern = [1740, 1200, 1500, 1305, 1740, 1200, 1605, 1410]
    return [[pattern[k % len(pattern)] for k in range(len(o))] for o in schedule.orders]


@pytest.mark.parametrize(("switch_s", "hop_s"), [(0.0, HOP), (SWITCH, HOP), (SWITCH, 0.0)])
def test_switching_and_hops_are_counted_together_as_emulated_gpus_measure(setup, switch_s, hop_s):
    profile, wl, schedule = setup
    freqs = _changing_plan(schedule)
    ev = evaluate(profile, schedule, freqs, P2P, switch_latency_s=switch_s, hop_latency_s=hop_s)
    t, e = _replay(schedule, wl, freqs, switch_s, hop_s)
    assert t == pytest.approx(ev.iteration_time_s, rel=1e-9)
    assert e == pytest.approx(ev.energy_j, abs=5e-3)  # the counter counts whole mJ
    without_hops = evaluate(profile, schedule, freqs, P2P, switch_latency_s=switch_s)
    if hop_s:
        assert ev.iteration_time_s > without_hops.iteration_time_s + 4 * hop_s - 1e-12


def test_calibration_recovers_the_hop_latency_of_a_replayed_job(setup):
    profile, wl, schedule = setup
    pp = pipeline_problem(profile, schedule, P2P)
    all_max = max_frequencies(profile, schedule)
    measured, _ = _replay(schedule, wl, all_max, 0.0, HOP)
    assert calibrate_hop_latency(pp, all_max, measured) == pytest.approx(HOP, rel=1e-6)
    # A plan with clock changes, measured with switching: calibrated with the same
    # switching latency, the hops are recovered; ignoring it, the switches are charged to them.
    freqs = _changing_plan(schedule)
    measured, _ = _replay(schedule, wl, freqs, SWITCH, HOP)
    hop = calibrate_hop_latency(pp, freqs, measured, switch_latency_s=SWITCH)
    assert hop == pytest.approx(HOP, rel=1e-6)
    assert calibrate_hop_latency(pp, freqs, measured) > 1.01 * HOP
    (t,) = hop_times(pp, [freqs], hop, switch_latency_s=SWITCH)
    assert t == pytest.approx(measured, rel=1e-9)
    # Already as slow as measured: no hop latency.
    assert calibrate_hop_latency(pp, all_max, 0.5 * measured) == 0.0


def test_hop_times_are_the_lagged_scores_of_the_plans(setup):
    profile, _, schedule = setup
    pp = pipeline_problem(profile, schedule, P2P, hop_latency_s=0.001)  # replaced, not added
    plans = [max_frequencies(profile, schedule), _changing_plan(schedule)]
    times = hop_times(pp, plans, HOP)
    for plan, t in zip(plans, times, strict=True):
        assert t == evaluate(profile, schedule, plan, P2P, hop_latency_s=HOP).iteration_time_s
    assert hop_times(pp, [], HOP).shape == (0,)


@pytest.mark.parametrize("bad", [-0.001, float("nan"), float("inf"), 11.0])
def test_bad_hop_latencies_are_clear_solver_errors(setup, bad):
    profile, _, schedule = setup
    freqs = max_frequencies(profile, schedule)
    with pytest.raises(SolverError, match="hop latency must be between 0 and 10 s"):
        evaluate(profile, schedule, freqs, P2P, hop_latency_s=bad)
    with pytest.raises(SolverError, match="hop latency must be between 0 and 10 s"):
        hop_times(pipeline_problem(profile, schedule, P2P), [freqs], bad)


def test_calibration_refuses_what_no_hop_latency_explains(setup):
    profile, _, schedule = setup
    pp = pipeline_problem(profile, schedule, P2P)
    freqs = max_frequencies(profile, schedule)
    with pytest.raises(SolverError, match="no hop latency up to 10 s explains it"):
        calibrate_hop_latency(pp, freqs, 1000.0)
    with pytest.raises(SolverError, match="positive number"):
        calibrate_hop_latency(pp, freqs, -1.0)
    with pytest.raises(SolverError, match="switch_latency_s"):
        calibrate_hop_latency(pp, freqs, 1.0, switch_latency_s=-1.0)


def test_the_problem_cache_keys_on_the_hop_latency(setup):
    profile, _, schedule = setup
    free = pipeline_problem(profile, schedule, P2P)
    hopped = pipeline_problem(profile, schedule, P2P, hop_latency_s=HOP)
    assert hopped is not free and hopped.hop_latency_s == HOP and free.hop_latency_s == 0.0
    assert pipeline_problem(profile, schedule, P2P, hop_latency_s=HOP) is hopped
    assert pipeline_problem(profile, schedule, P2P) is free
    assert hopped.solver.has_lags and not free.solver.has_lags


def test_plans_carry_their_hop_latency_and_are_rescored_at_it(setup, tmp_path):
    profile, _, schedule = setup
    freqs = _changing_plan(schedule)
    plan = make_plan(profile, schedule, freqs, P2P, switch_latency_s=SWITCH, hop_latency_s=HOP)
    assert plan.hop_latency == HOP
    save_plan(plan, tmp_path / "p.json")
    loaded = load_plan(tmp_path / "p.json")
    assert loaded.hop_latency == HOP
    ev = evaluate_plan(profile, loaded)  # at its own latencies
    assert (ev.iteration_time_s, ev.energy_j) == (plan.iteration_time, plan.energy)
    free = evaluate_plan(profile, loaded, hop_latency_s=0.0)
    assert free.iteration_time_s < plan.iteration_time
    # Omitted when zero: plan files without hops are unchanged.
    assert "hop_latency" not in make_plan(profile, schedule, freqs, P2P).model_dump_json()
    for bad in (-0.5, 11.0):
        data = json.loads((tmp_path / "p.json").read_text())
        data["hop_latency"] = bad
        (tmp_path / "bad.json").write_text(json.dumps(data))
        with pytest.raises(PlanError, match="hop_latency"):
            load_plan(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="hop_latency"):
        Plan.model_validate({**json.loads(plan.model_dump_json()), "hop_latency": "fast"})


def test_a_frontier_solved_with_hops_writes_and_reads_them(setup, tmp_path):
    profile, wl, schedule = setup
    frontier = solve_frontier(profile, schedule, p2p_power_w=P2P, max_points=20, hop_latency_s=HOP)
    assert frontier.hop_latency_s == HOP
    assert frontier.all_max is not None
    all_max = evaluate(
        profile, schedule, max_frequencies(profile, schedule), P2P, hop_latency_s=HOP
    )
    assert frontier.all_max.iteration_time_s == all_max.iteration_time_s
    # The no-slowdown plan, replayed with the hops, is no slower than all-max replayed.
    chosen = frontier.choose(max_slowdown=0.0)
    base_t, _ = _replay(schedule, wl, max_frequencies(profile, schedule), 0.0, HOP)
    t, e = _replay(schedule, wl, chosen.frequencies, 0.0, HOP)
    assert t <= base_t * (1 + 1e-9)
    assert t == pytest.approx(chosen.iteration_time_s, rel=1e-9)
    assert e == pytest.approx(chosen.energy_j, abs=5e-3)
    frontier.write(tmp_path / "f")
    back = Frontier.read(tmp_path / "f")
    assert back.hop_latency_s == HOP
    for path in sorted((tmp_path / "f" / "plans").glob("plan_*.json")):
        plan = load_plan(path)
        assert plan.hop_latency == HOP
        ev = evaluate_plan(profile, plan)
        assert (ev.iteration_time_s, ev.energy_j) == pytest.approx(
            (plan.iteration_time, plan.energy), rel=1e-12
        )
