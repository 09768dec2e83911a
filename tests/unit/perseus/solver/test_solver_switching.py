"""The switching model: plans whose clock changes take time to apply
(`perseus.planning.switching`)."""

from __future__ import annotations

import itertools
import math

import pytest

from perseus.domain.plan import clock_changes
from perseus.domain.profile import InstructionProfile
from perseus.domain.schedule import make_schedule
from perseus.planning import Frontier, evaluate, max_frequencies, pipeline_problem, solve_frontier
from perseus.planning.switching import repair_frequencies
from perseus.synth import stage_workloads, synthesize_profile
from zeus_power.device.emulated import EmulatedGPU, VirtualClock

GPU = "A40"
L = 0.015
P2P = 70.38


@pytest.fixture(scope="module")
def setup():
    workloads = stage_workloads(GPU, [1.0, 1.3], base_forward_ms=8.0)
    frame = synthesize_profile(GPU, workloads, min_freq_mhz=1200)
    profile = InstructionProfile.from_frame(frame, source="synth")
    return profile, workloads, make_schedule("1f1b", 2, 4)


def _replay(schedule, workloads, frequencies, latency_s):
    """The plan run twice on emulated GPUs that switch with `latency_s` (virtual time):
    (time, energy) of the second iteration. Independent of the planner's arithmetic; ideal
    sensors: one iteration's energy is compared to the mJ."""
    clocks = [VirtualClock() for _ in schedule.orders]
    gpus = [
        EmulatedGPU(r, gpu_type=GPU, clock=c, switch_latency_s=latency_s, sensors="ideal")
        for r, c in enumerate(clocks)
    ]
    position = {ins: k for order in schedule.orders for k, ins in enumerate(order)}
    dag, begin = schedule.dag(), 0.0
    for _ in range(2):
        start_mj = [g.total_energy_mj() for g in gpus]
        finish = {}
        for ins in schedule.instructions():
            s = max((finish[p] for p in dag.predecessors(ins)), default=begin)
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


def test_clock_changes_counts_per_iteration_cyclically():
    assert clock_changes([[1410, 1410, 1200, 1200, 1410]]) == 2
    assert clock_changes([[1410, 1200], [900, 900], [705]]) == 2
    assert clock_changes([[1410] * 6]) == 0


def test_a_plan_without_changes_is_unaffected(setup):
    profile, _, schedule = setup
    freqs = max_frequencies(profile, schedule)
    assert clock_changes(freqs) == 0
    free = evaluate(profile, schedule, freqs, P2P)
    switching = evaluate(profile, schedule, freqs, P2P, switch_latency_s=L)
    assert switching.iteration_time_s == pytest.approx(free.iteration_time_s, rel=1e-12)
    assert switching.energy_j == pytest.approx(free.energy_j, rel=1e-12)


@pytest.mark.parametrize("latency_s", [0.005, L, 0.03])
def test_the_accounting_is_what_emulated_gpus_with_latency_measure(setup, latency_s):
    profile, workloads, schedule = setup
    wl = [{False: f, True: b} for f, b in workloads]
    freqs = [[1740, 1200, 1500, 1305, 1740, 1200, 1605, 1410] for _ in schedule.orders]
    ev = evaluate(profile, schedule, freqs, P2P, switch_latency_s=latency_s)
    free = evaluate(profile, schedule, freqs, P2P)
    t, e = _replay(schedule, wl, freqs, latency_s)
    assert t == pytest.approx(ev.iteration_time_s, rel=1e-9)
    assert e == pytest.approx(ev.energy_j, abs=5e-3)  # the counter counts whole mJ
    assert abs(t / free.iteration_time_s - 1) > 0.001  # the latency matters here


def test_unreachable_changes_are_repaired(setup):
    profile, _, schedule = setup
    pp = pipeline_problem(profile, schedule, P2P)
    n = len(schedule.orders[0])
    # Down into an 8 ms forward (shorter than 15 ms): it keeps the clock in force.
    down = [[1740] * n, [1740] * n]
    down[0][1] = 1200  # instruction 1 of rank 0 is a forward
    assert schedule.orders[0][1].kind == "forward"
    fixed = repair_frequencies(pp, down, L, hoist=False)
    assert fixed[0][1] == 1740 and clock_changes(fixed) == 0
    # The same change with a 5 ms latency is reachable: kept.
    assert repair_frequencies(pp, down, 0.005, hoist=False) == down
    # Up: asked for early, from the instruction before, which then runs faster, never slower.
    up = [[1200] * n, [1200] * n]
    up[1][4] = 1740
    assert [i.kind for i in schedule.orders[1][2:5]] == ["forward", "backward", "forward"]
    fixed = repair_frequencies(pp, up, L)
    assert fixed[1][4] == 1740 and fixed[1][3] == 1740 and fixed[1][2] == 1200
    before = pp.evaluate(up)
    after = pp.evaluate(fixed, switch_latency_s=L)
    assert after.iteration_time_s <= before.iteration_time_s + 1e-12


def test_the_frontier_with_the_model_meets_the_budget_with_switches_counted(setup, tmp_path):
    profile, workloads, schedule = setup
    wl = [{False: f, True: b} for f, b in workloads]
    model = solve_frontier(profile, schedule, p2p_power_w=P2P, switch_latency_s=L)
    today = solve_frontier(profile, schedule, p2p_power_w=P2P)
    assert model.switch_latency_s == L
    for p in model.points:  # every point's numbers are the switching accounting's
        ev = evaluate(profile, schedule, p.frequencies, P2P, switch_latency_s=L)
        assert (p.iteration_time_s, p.energy_j) == pytest.approx((ev.iteration_time_s, ev.energy_j))
    times = [p.iteration_time_s for p in model.points]
    energies = [p.energy_j for p in model.points]
    assert times == sorted(times) and all(a > b for a, b in itertools.pairwise(energies))
    base_t, _ = _replay(schedule, wl, max_frequencies(profile, schedule), L)
    chosen = model.choose(max_slowdown=0.0)
    t, e = _replay(schedule, wl, chosen.frequencies, L)
    assert t <= base_t * (1 + 1e-9)  # no slowdown, measured
    assert t == pytest.approx(chosen.iteration_time_s, rel=1e-9)
    assert e == pytest.approx(chosen.energy_j, abs=5e-3)  # the counter counts whole mJ
    naive = today.choose(max_slowdown=0.0)
    assert _replay(schedule, wl, naive.frequencies, L)[0] > base_t * 1.005  # today's misses
    # Plan files say how many changes and at what latency their numbers are.
    model.write(tmp_path / "f")
    back = Frontier.read(tmp_path / "f")
    assert back.switch_latency_s == L
    plan = model._plan(chosen)
    assert plan.clock_changes == clock_changes(chosen.frequencies)
    assert plan.switch_latency == L and math.isfinite(plan.iteration_time)
    assert "switch_latency" not in today._plan(today.points[0]).model_dump_json()
