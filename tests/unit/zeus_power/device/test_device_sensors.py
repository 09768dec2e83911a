"""What an emulated GPU's sensors show: refreshes, the sampled window, noise, read latency."""

from __future__ import annotations

import time

import numpy as np
import pytest

from zeus_power.device import IDEAL_SENSORS, REAL_SENSORS, SensorSpec, open_gpus
from zeus_power.device.base import GPUValueError
from zeus_power.device.emulated import EmulatedGPU, VirtualClock
from zeus_power.device.sensors import EnergyMeter


def _meter(sensors: SensorSpec, *, phase_seed: int = 0) -> EnergyMeter:
    return EnergyMeter(50.0, 0.0, sensors, np.random.default_rng(phase_seed))


def test_the_counter_shows_only_whole_refreshes():
    clock = VirtualClock()
    gpu = EmulatedGPU(0, gpu_type="A100-SXM", clock=clock, seed=1)
    assert gpu.sensors == REAL_SENSORS  # on by default
    readings = []
    for _ in range(300):  # 3 s in 10 ms steps
        clock.advance(0.01)
        readings.append(gpu.total_energy_mj())
    steps = np.flatnonzero(np.diff(readings)) + 1
    # It changes once per 100 ms, not at every read, and each change is about a period's idle
    # energy (55 W × 0.1 s), within the 1 % noise.
    assert 28 <= len(steps) <= 30
    assert np.all(np.diff(steps) == 10)
    # (the first covers the part of a period since the GPU was opened)
    assert np.diff(readings)[steps[1:] - 1] == pytest.approx(5500, rel=0.05)
    assert gpu.power_usage_mw() == pytest.approx(55_000, rel=0.05)


def test_work_shows_at_the_next_refresh_and_the_total_is_conserved():
    spec = SensorSpec(period_s=0.1, noise=0.0, read_latency_s=0.0)
    meter = _meter(spec)
    meter.add(0.0, 0.35, 450.0)  # 400 W above idle for 0.35 s
    before = meter.counter_j(0.30)
    exact = 50.0 * 10.0 + 400.0 * 0.35
    after = meter.counter_j(10.0)
    assert before < meter.exact_j(0.30)  # the counter lags the truth by up to a period
    assert after == pytest.approx(meter.exact_j(meter._last_tick_s))
    assert meter.exact_j(10.0) == pytest.approx(exact)
    # Work booked late (after its periods were shown) reaches the next refresh: nothing lost.
    meter.add(5.0, 5.5, 250.0)
    assert meter.counter_j(20.0) == pytest.approx(meter.exact_j(meter._last_tick_s))


def test_a_partial_window_sees_only_the_end_of_each_period():
    spec = SensorSpec(period_s=0.1, window=0.25, noise=0.0, read_latency_s=0.0)
    meter = _meter(spec)
    phase = meter._next_tick_s
    # Busy in the first half of every period, idle in the sampled last quarter: unseen.
    for k in range(10):
        start = phase + 0.1 * k
        meter.add(start, start + 0.05, 450.0)
    assert meter.exact_j(phase + 1.0) - meter.exact_j(phase) == pytest.approx(50.0 + 400 * 0.5)
    first = meter.counter_j(phase)
    shown = meter.counter_j(phase + 1.0) - first
    assert shown == pytest.approx(50.0 * 1.0, rel=1e-6)  # idle power only


def test_noise_is_seeded_unbiased_and_never_runs_the_counter_backwards():
    def run(seed: int) -> list[int]:
        clock = VirtualClock()
        gpu = EmulatedGPU(0, clock=clock, seed=seed, sensors=SensorSpec(noise=0.2))
        out = []
        for _ in range(2000):
            clock.advance(0.1)
            out.append(gpu.total_energy_mj())
        return out

    a, b, c = run(3), run(3), run(4)
    assert a == b and a != c
    assert a == sorted(a)
    assert a[-1] / 1000 == pytest.approx(55.0 * 200.0, rel=0.02)  # 20 % per step averages out


def test_a_counter_read_takes_its_latency_on_a_real_clock():
    gpu = EmulatedGPU(0, sensors=SensorSpec(read_latency_s=0.02))
    start = time.perf_counter()
    gpu.total_energy_mj()
    assert time.perf_counter() - start >= 0.02
    virtual = EmulatedGPU(0, clock=VirtualClock(), sensors=SensorSpec(read_latency_s=0.02))
    virtual.total_energy_mj()
    assert virtual.clock() == 0.0  # a read costs no virtual time


def test_ideal_sensors_are_exact_and_named():
    clock = VirtualClock()
    gpu = EmulatedGPU(0, clock=clock, sensors="ideal")
    assert gpu.sensors is IDEAL_SENSORS and gpu.sensors.ideal
    gpu.begin_busy(300.0)
    clock.advance(0.013)
    assert gpu.power_usage_mw() == 300_000
    assert gpu.total_energy_mj() == pytest.approx(300.0 * 13, abs=1)
    gpu.end_busy(0.013, 300.0 * 0.013)
    clock.advance(0.007)
    assert gpu.total_energy_mj() == pytest.approx(300.0 * 13 + 55.0 * 7, abs=1)
    with pytest.raises(GPUValueError, match="Unknown sensor mode 'perfect'"):
        EmulatedGPU(0, sensors="perfect")


def test_begin_and_end_busy_book_the_exact_energy_a_switch_gave():
    clock = VirtualClock()
    gpu = EmulatedGPU(0, clock=clock, sensors=SensorSpec(noise=0.0))
    gpu.begin_busy(400.0)
    clock.advance(0.5)
    gpu.end_busy(0.5, 150.0)  # 300 W on average, say, after a clock switch inside it
    clock.advance(2.0)
    assert gpu.total_energy_mj() / 1000 == pytest.approx(150.0 + 55.0 * 2.0, abs=55.0 * 0.1)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("period_s", -0.1, "period_s"),
        ("window", 0.0, "window"),
        ("window", 1.5, "window"),
        ("read_latency_s", float("nan"), "read_latency_s"),
        ("noise", 2.0, "noise"),
    ],
)
def test_bad_sensor_specs_are_refused(field, value, message):
    with pytest.raises(GPUValueError, match=message):
        SensorSpec(**{field: value})


def test_sensor_settings_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("ZEUS_EMULATED_SENSOR_PERIOD_MS", "50")
    monkeypatch.setenv("ZEUS_EMULATED_SENSOR_WINDOW", "0.25")
    monkeypatch.setenv("ZEUS_EMULATED_SENSOR_READ_MS", "1")
    monkeypatch.setenv("ZEUS_EMULATED_SENSOR_NOISE", "0")
    (gpu,) = open_gpus([0], backend="emulated")
    assert gpu.sensors == SensorSpec(period_s=0.05, window=0.25, read_latency_s=0.001, noise=0.0)
    monkeypatch.setenv("ZEUS_EMULATED_SENSORS", "ideal")
    assert open_gpus([0], backend="emulated")[0].sensors is IDEAL_SENSORS
    monkeypatch.setenv("ZEUS_EMULATED_SENSOR_WINDOW", "0")
    with pytest.raises(GPUValueError, match="ZEUS_EMULATED_SENSOR_WINDOW"):
        open_gpus([0], backend="emulated")
