"""The power a GPU draws after its work stops, counted in a plan's energy: against an
independent replay on emulated GPUs whose power decays after each instruction."""

from __future__ import annotations

import itertools
import math

import pytest

from perseus.domain.profile import InstructionProfile
from perseus.domain.schedule import make_schedule
from perseus.planning import (
    AfterWork,
    after_work_energy_j,
    evaluate,
    max_frequencies,
    pipeline_problem,
)
from perseus.protocol import AFTER_WORK_EDGES_S
from perseus.synth import stage_workloads, synthesize_profile
from zeus_power.device.emulated import EmulatedGPU, VirtualClock

GPU = "A40"


@pytest.fixture(scope="module")
def setup():
    # Short instructions (2-4 ms forwards) between bubbles of a few ms: what a GPU draws
    # after its work stops is much of an iteration's energy.
    workloads = stage_workloads(GPU, [1.0, 2.0, 1.2], base_forward_ms=2.0)
    frame = synthesize_profile(GPU, workloads, min_freq_mhz=1200)
    profile = InstructionProfile.from_frame(frame, source="synth")
    wl = [{False: f, True: b} for f, b in workloads]
    idle_w = EmulatedGPU(0, gpu_type=GPU).idle_power_w
    return profile, wl, make_schedule("1f1b", 3, 4), idle_w


def _replay(schedule, workloads, frequencies, decay_s):
    """The plan run three times on emulated GPUs whose power decays with time constant
    `decay_s` after each instruction (idle between them, nothing booked): the energy the
    GPUs drew in the last iteration, exactly (`EmulatedGPU.drawn_energy_j`)."""
    clocks = [VirtualClock() for _ in schedule.orders]
    gpus = [
        EmulatedGPU(r, gpu_type=GPU, clock=c, sensors="ideal", power_decay_s=decay_s)
        for r, c in enumerate(clocks)
    ]
    position = {ins: k for order in schedule.orders for k, ins in enumerate(order)}
    dag, begin, energy = schedule.dag(), 0.0, 0.0
    for _ in range(3):
        drawn = [g.drawn_energy_j(begin) for g in gpus]
        finish = {}
        for ins in schedule.instructions():
            s = max((finish[p] for p in dag.predecessors(ins)), default=begin)
            gpu, clock = gpus[ins.rank], clocks[ins.rank]
            clock.advance(max(s - clock(), 0.0))
            f = frequencies[ins.rank][position[ins]]
            gpu.lock_sm_clocks(f, f)
            finish[ins] = s + gpu.execute(workloads[ins.stage][ins.kind == "backward"]).time_s
        end = max(finish.values())
        energy = sum(g.drawn_energy_j(end) - d for g, d in zip(gpus, drawn, strict=True))
        begin = end
    return energy


def _exponential_shares(decay_s):
    """Each band's mean of exp(−t/τ): what an exponential decay draws there on average."""
    edges = (0.0, *AFTER_WORK_EDGES_S)
    return [
        decay_s / (b - a) * (math.exp(-a / decay_s) - math.exp(-b / decay_s))
        for a, b in itertools.pairwise(edges)
    ]


@pytest.mark.parametrize("decay_ms", [2.0, 6.0])
def test_the_power_after_work_stops_is_what_the_static_accounting_misses(setup, decay_ms):
    profile, wl, schedule, idle_w = setup
    max_freqs = max_frequencies(profile, schedule)
    low = [[1410] * len(order) for order in schedule.orders]
    after = AfterWork(dict.fromkeys(range(3), _exponential_shares(decay_ms / 1000)))
    for freqs in (max_freqs, low):
        drawn = _replay(schedule, wl, freqs, decay_ms / 1000)
        static = evaluate(profile, schedule, freqs, idle_w).energy_j
        tails = after_work_energy_j(pipeline_problem(profile, schedule, idle_w), freqs, after)
        assert drawn > 1.03 * static  # the decay is a real part of the iteration's energy
        # The bands' mean shares explain nearly all of it (a bubble that ends inside a
        # band draws a little more than the band's mean there).
        assert abs(drawn - (static + tails)) < 0.15 * (drawn - static), (drawn, static, tails)
    # Without a decay nothing is added.
    assert (
        after_work_energy_j(
            pipeline_problem(profile, schedule, idle_w), low, AfterWork({0: [0.0, 0.0]})
        )
        == 0.0
    )


def test_after_work_shares_are_bounded_and_round_trip():
    after = AfterWork({0: [0.9, 0.4, 0.1], 2: [0.5]})
    assert AfterWork.from_json(after.to_json()) == AfterWork({0: [0.9, 0.4, 0.1], 2: [0.5]})
    # A bounded fit's shares are its bounds give or take rounding (seen: -2.2e-19).
    assert AfterWork({1: [0.0, -2.2e-19, 1 + 1e-12]}).shares == {1: [0.0, 0.0, 1.0]}
    for bad in ({0: [1.5]}, {0: [-0.1]}, {0: [math.nan]}, {0: [0.1, 0.1, 0.1, 0.1]}):
        with pytest.raises(ValueError, match="shares"):
            AfterWork(bad)
    for junk in ([1, 2], {"0": "high"}, {"0": [True]}, {"x": [0.5]}):
        with pytest.raises(ValueError):
            AfterWork.from_json(junk)
