"""An emulated GPU's power after work stops (an exponential tail) and its slow drift."""

from __future__ import annotations

import math

import numpy as np
import pytest

from zeus_power.device import CALIBRATED_POWER_DECAY_S, SensorSpec, open_gpus
from zeus_power.device.base import GPUValueError
from zeus_power.device.emulated import (
    MAX_POWER_DECAY_S,
    EmulatedGPU,
    VirtualClock,
    Workload,
)
from zeus_power.device.sensors import EnergyMeter

EXACT = SensorSpec(period_s=0.1, noise=0.0, read_latency_s=0.0)
"""Refreshing sensors without noise: each refresh shows the exact energy up to it."""


def drawn_j(
    t: float, idle_w: float, busy: list[tuple[float, float, float]], tau: float, *, cut=True
) -> float:
    """Energy from 0 to `t` written out: idle, plus each busy (start, end, power) above idle,
    plus its tail ``(power − idle)·exp(−(s − end)/τ)`` until the next one starts (with
    ``cut=False``: until `t`)."""
    total = idle_w * t
    for i, (a, b, p) in enumerate(busy):
        e = p - idle_w
        total += e * max(0.0, min(t, b) - a)
        cut_s = busy[i + 1][0] if cut and i + 1 < len(busy) else math.inf
        if tau > 0 and t > b:
            total += e * tau * (1.0 - math.exp(-(min(t, cut_s) - b) / tau))
    return total


def test_a_tail_draws_the_closed_form_energy_and_the_exact_power():
    clock = VirtualClock()
    tau = 0.02
    gpu = EmulatedGPU(0, gpu_type="H100-SXM", clock=clock, sensors="ideal", power_decay_s=tau)
    idle = gpu.idle_power_w
    gpu.begin_busy(600.0)
    clock.advance(0.01)
    gpu.end_busy(0.01, 6.0)
    # The power right after: near busy, then falling with τ.
    assert gpu.power_usage_mw() == pytest.approx(600_000, abs=1)
    powers = []
    for _ in range(2000):  # 0.1 s in 50 µs steps
        clock.advance(0.00005)
        powers.append(gpu.power_usage_mw() / 1000)
    s = 0.00005 * np.arange(1, 2001)
    assert powers == pytest.approx(idle + (600.0 - idle) * np.exp(-s / tau), abs=1e-3)
    # The energy: 6 J of work, idle over 0.11 s, and the tail: 530 W × 20 ms × (1 − e⁻⁵).
    tail_j = (600.0 - idle) * tau * (1 - math.exp(-0.1 / tau))
    assert tail_j == pytest.approx(10.53, abs=0.01)
    assert gpu.total_energy_mj() / 1000 == pytest.approx(6.0 + idle * 0.1 + tail_j, abs=1e-3)
    # and the counter is the power's integral (trapezoids over the readings: within 0.01 %).
    grid = np.concatenate(([600.0], powers))
    integral = float(np.sum((grid[1:] + grid[:-1]) / 2) * 0.00005)
    assert integral == pytest.approx(idle * 0.1 + tail_j, rel=1e-4)


def test_the_next_busy_period_cuts_the_tail():
    clock = VirtualClock()
    tau = 0.03
    gpu = EmulatedGPU(0, gpu_type="A100-SXM", clock=clock, sensors="ideal", power_decay_s=tau)
    idle = gpu.idle_power_w  # 55 W
    gpu.record_busy(0.0, 300.0)  # nothing
    clock.advance(0.02)
    gpu.record_busy(0.02, 400.0)  # [0, 0.02] at 400 W, booked after the fact
    clock.advance(0.005)
    before = gpu.power_usage_mw() / 1000
    assert before == pytest.approx(idle + 345.0 * math.exp(-0.005 / tau), abs=1e-3)
    gpu.begin_busy(150.0)  # the new work's power takes over at once
    assert gpu.power_usage_mw() == 150_000
    clock.advance(0.01)
    gpu.end_busy(0.01, 1.5)
    clock.advance(0.005)
    # A wait booked after the fact cuts the tail of the work before it where it began.
    gpu.record_busy(0.005, 100.0)
    clock.advance(1.0)
    busy = [(0.0, 0.02, 400.0), (0.025, 0.035, 150.0), (0.035, 0.04, 100.0)]
    expected = drawn_j(clock(), idle, busy, tau)
    assert gpu.total_energy_mj() / 1000 == pytest.approx(expected, abs=1e-3)
    # The tails were cut: 345 W decaying over 5 ms and 95 W over none, not all of
    # 345 W × τ and 95 W × τ (8.76 J and 2.85 J more).
    uncut = drawn_j(clock(), idle, busy, tau, cut=False)
    assert uncut - expected == pytest.approx(
        345.0 * tau * math.exp(-0.005 / tau) + 95.0 * tau, abs=1e-6
    )


def test_without_decay_the_power_drops_to_idle_at_once():
    clock = VirtualClock()
    gpu = EmulatedGPU(0, clock=clock, sensors="ideal")
    assert gpu.power_decay_s == 0.0 and gpu.power_drift_per_hour == 0.0
    result = gpu.execute(Workload(0.05, 0.01))
    clock.advance(0.001)
    assert gpu.power_usage_mw() == round(gpu.idle_power_w * 1000)
    clock.advance(0.999)
    assert gpu.total_energy_mj() / 1000 == pytest.approx(
        result.energy_j + gpu.idle_power_w * 1.0, abs=1e-3
    )


def test_energy_is_conserved_and_the_counter_monotone_on_refreshing_sensors():
    rng = np.random.default_rng(7)
    tau = 0.05
    clocks = [VirtualClock(), VirtualClock()]
    gpus = [
        EmulatedGPU(0, gpu_type="H100-SXM", clock=clocks[0], sensors=EXACT, power_decay_s=tau),
        EmulatedGPU(0, gpu_type="H100-SXM", clock=clocks[1], sensors="ideal", power_decay_s=tau),
    ]
    idle = gpus[0].idle_power_w
    busy = []
    readings: list[list[int]] = [[], []]
    for step in range(3000):  # about 60 s of work and gaps, read as it goes
        d = float(rng.uniform(0.001, 0.02))
        p = float(rng.uniform(150.0, 700.0))
        start = clocks[0]()
        for gpu, clock, out in zip(gpus, clocks, readings, strict=True):
            if step % 3 == 0:
                clock.advance(d)
                out.append(gpu.total_energy_mj())  # shows the tail of the work before
                gpu.record_busy(d, p)  # after the fact: cuts that tail where it began
            else:
                gpu.begin_busy(p)
                clock.advance(d)
                gpu.end_busy(d, p * d)
        busy.append((start, start + d, p))
        gap = float(rng.choice([0.0, rng.uniform(0.0, 0.1)]))
        for gpu, clock, out in zip(gpus, clocks, readings, strict=True):
            clock.advance(gap)
            if step % 2:
                out.append(gpu.total_energy_mj())
    assert all(np.all(np.diff(r) >= 0) for r in readings)  # never backwards
    for clock in clocks:
        clock.advance(5.0)
    t = clocks[0]()
    expected = drawn_j(t, idle, busy, tau)
    # Ideal sensors show it exactly; refreshing ones show it as of their last refresh.
    assert gpus[1].total_energy_mj() / 1000 == pytest.approx(expected, rel=1e-9, abs=2e-3)
    meter = gpus[0]._meter
    shown = gpus[0].total_energy_mj() / 1000
    assert shown == pytest.approx(drawn_j(meter._last_tick_s, idle, busy, tau), abs=2e-3)
    assert len(meter._segments) < 10  # folded as it went


def test_a_tail_cut_after_it_was_shown_is_paid_back_not_run_backwards():
    tau = 0.05
    meter = EnergyMeter(50.0, 0.0, EXACT, np.random.default_rng(0), decay_s=tau)
    meter.add(0.0, 0.05, 650.0)
    first = meter.counter_j(0.5)  # shows most of the tail
    meter.add(0.06, 0.5, 51.0)  # booked late: the tail ended at 0.06, not 0.5
    exact = 50.0 * 0.5 + 600.0 * 0.05 + 600.0 * tau * (1 - math.exp(-0.01 / tau)) + 1.0 * 0.44
    assert meter.exact_j(0.5) == pytest.approx(exact, rel=1e-12)
    first_tick = meter._last_tick_s
    # What it showed before the late booking: the exact energy with the uncut tail.
    assert first == pytest.approx(drawn_j(first_tick, 50.0, [(0.0, 0.05, 650.0)], tau))
    assert first > meter.exact_j(first_tick) + 10.0  # now more than was drawn by then
    shown = [meter.counter_j(0.5 + 0.1 * k) for k in range(1, 60)]
    assert np.all(np.diff([first, *shown]) >= 0)
    assert shown[0] == first  # the next refresh pays back what the cut took
    # and once paid, the counter is the exact energy again: nothing lost, nothing added.
    assert meter.counter_j(7.0) == pytest.approx(meter.exact_j(meter._last_tick_s), rel=1e-12)
    assert meter._last_tick_s > first_tick


def test_work_booked_after_the_folded_past_keeps_its_tail():
    tau = 0.1
    meter = EnergyMeter(50.0, 0.0, EXACT, np.random.default_rng(0), decay_s=tau)
    meter.counter_j(5.0)  # refreshes and folds up to about 4.9 s
    meter.add(1.0, 1.5, 250.0)
    assert meter.exact_j(6.0) == pytest.approx(50.0 * 6.0 + 200.0 * 0.5 + 200.0 * tau)


def test_drift_scales_booked_busy_power_after_an_emulated_hour():
    clock = VirtualClock(1000.0)
    gpu = EmulatedGPU(0, gpu_type="A100-SXM", clock=clock, sensors="ideal")
    drifting = EmulatedGPU(
        0, gpu_type="A100-SXM", clock=clock, sensors="ideal", power_drift_per_hour=0.1
    )
    idle = gpu.idle_power_w
    clock.advance(3600.0 - 0.5)
    e0 = [g.total_energy_mj() for g in (gpu, drifting)]
    clock.advance(1.0)
    for g in (gpu, drifting):
        g.record_busy(1.0, 300.0)  # its midpoint is one hour after the GPU was opened
    booked = [
        (g.total_energy_mj() - e) / 1000 - idle for g, e in zip((gpu, drifting), e0, strict=True)
    ]
    assert booked[0] == pytest.approx(245.0, abs=1e-3)
    assert booked[1] == pytest.approx(245.0 * 1.1, abs=1e-3)
    # The work's own figures stay the model's: execute's result and busy_power_w.
    assert drifting.busy_power_w(0.3) == gpu.busy_power_w(0.3)
    before = drifting.total_energy_mj()
    work = Workload(0.2, 0.1, activity=0.5)  # 275 W: 297 W after the drift, under the limit
    result = drifting.execute(work, wait=False)
    assert result == gpu.execute(work, wait=False)
    clock.advance(result.time_s)
    extra = (drifting.total_energy_mj() - before) / 1000 - idle * result.time_s
    factor = 1 + 0.1 * (3600.5 + result.time_s / 2) / 3600
    assert extra == pytest.approx((result.power_w - idle) * result.time_s * factor, rel=1e-5)


def test_drift_keeps_power_within_idle_and_the_power_limit():
    clock = VirtualClock()
    up = EmulatedGPU(0, gpu_type="A100-SXM", clock=clock, sensors="ideal", power_drift_per_hour=0.5)
    down = EmulatedGPU(
        0, gpu_type="A100-SXM", clock=clock, sensors="ideal", power_drift_per_hour=-0.5
    )
    clock.advance(3 * 3600.0)  # factors 2.5 and −0.5
    assert up.drift_factor() == pytest.approx(2.5) and down.drift_factor() == pytest.approx(-0.5)
    start = [g.total_energy_mj() for g in (up, down)]
    clock.advance(1.0)
    for g in (up, down):
        g.record_busy(1.0, 300.0)
    drawn = [(g.total_energy_mj() - e) / 1000 for g, e in zip((up, down), start, strict=True)]
    assert drawn[0] == pytest.approx(400.0, abs=1e-3)  # the 400 W limit in force
    assert drawn[1] == pytest.approx(55.0, abs=1e-3)  # never below idle


def test_the_constructor_defaults_are_off_and_bad_values_refused():
    gpu = EmulatedGPU(0)
    assert gpu.power_decay_s == 0.0 and gpu.power_drift_per_hour == 0.0
    assert 0.0 < CALIBRATED_POWER_DECAY_S <= MAX_POWER_DECAY_S
    for bad in (-0.001, 1.5, float("nan")):
        with pytest.raises(GPUValueError, match="power_decay_s"):
            EmulatedGPU(0, power_decay_s=bad)
    for bad in (0.6, -0.51, float("inf")):
        with pytest.raises(GPUValueError, match="power_drift_per_hour"):
            EmulatedGPU(0, power_drift_per_hour=bad)


def test_decay_and_drift_come_from_the_environment(monkeypatch):
    monkeypatch.delenv("ZEUS_EMULATED_POWER_DECAY_MS", raising=False)
    monkeypatch.delenv("ZEUS_EMULATED_POWER_DRIFT_PER_HOUR", raising=False)
    (gpu,) = open_gpus([0], backend="emulated")
    assert gpu.power_decay_s == 0.0 and gpu.power_drift_per_hour == 0.0  # off by default
    monkeypatch.setenv("ZEUS_EMULATED_POWER_DECAY_MS", "25")
    monkeypatch.setenv("ZEUS_EMULATED_POWER_DRIFT_PER_HOUR", "-0.05")
    (gpu,) = open_gpus([0], backend="emulated")
    assert gpu.power_decay_s == pytest.approx(0.025)
    assert gpu.power_drift_per_hour == pytest.approx(-0.05)
    for bad in ("-1", "1001", "nan", "fast"):
        monkeypatch.setenv("ZEUS_EMULATED_POWER_DECAY_MS", bad)
        with pytest.raises(GPUValueError, match="ZEUS_EMULATED_POWER_DECAY_MS"):
            open_gpus([0], backend="emulated")
    monkeypatch.setenv("ZEUS_EMULATED_POWER_DECAY_MS", "1000")
    assert open_gpus([0], backend="emulated")[0].power_decay_s == 1.0
    for bad in ("0.6", "-0.7", "inf"):
        monkeypatch.setenv("ZEUS_EMULATED_POWER_DRIFT_PER_HOUR", bad)
        with pytest.raises(GPUValueError, match="ZEUS_EMULATED_POWER_DRIFT_PER_HOUR"):
            open_gpus([0], backend="emulated")
