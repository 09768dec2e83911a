"""ZeusMonitor on emulated GPUs: energy counter, power polling, nested/overlapping windows."""

from __future__ import annotations

import time

import pytest

from zeus_power.device.base import GPUInitError
from zeus_power.device.emulated import EmulatedGPU, VirtualClock, Workload
from zeus_power.errors import ZeusConfigError, ZeusMonitorError
from zeus_power.monitor import ZeusMonitor, aggregate_over_ranks

WORK = Workload(compute_s_at_max=0.1, memory_s=0.02)


def _gpu(clock: VirtualClock, index: int = 0, **kwargs) -> EmulatedGPU:
    """Ideal sensors: these tests check the monitor's arithmetic against the model's exact
    joules, to the mJ (a real counter refreshes every 100 ms; see the test at the end)."""
    return EmulatedGPU(index, gpu_type="A40", clock=clock, sensors="ideal", **kwargs)


@pytest.mark.parametrize("energy_counter", [True, False], ids=["counter", "polling"])
def test_window_measures_the_executed_work(energy_counter: bool) -> None:
    clock = VirtualClock(5.0)
    gpu = _gpu(clock, energy_counter=energy_counter)
    monitor = ZeusMonitor(gpus=[gpu], time_fn=clock)
    monitor.begin_window("w")
    runs = [gpu.execute(WORK) for _ in range(4)]
    m = monitor.end_window("w")
    assert m.time_s == pytest.approx(sum(r.time_s for r in runs))
    # Counter and polling are mJ/mW-quantised: within 4 mJ of the model's energy.
    assert m.gpu_energy_j[0] == pytest.approx(sum(r.energy_j for r in runs), abs=4e-3)
    assert m.total_energy_j == m.gpu_energy_j[0]
    assert (m.time, m.energy, m.total_energy) == (m.time_s, m.gpu_energy_j, m.total_energy_j)


def test_power_limit_changes_energy_and_time() -> None:
    clock = VirtualClock()
    gpu = _gpu(clock)
    monitor = ZeusMonitor(gpus=[gpu], time_fn=clock)
    monitor.begin_window("max")
    gpu.execute(WORK)
    at_max = monitor.end_window("max")
    gpu.set_power_limit_mw(150_000)
    monitor.begin_window("capped")
    gpu.execute(WORK)
    capped = monitor.end_window("capped")
    assert capped.time_s > at_max.time_s
    assert capped.total_energy_j / capped.time_s <= 150.0 + 1e-6


def test_nested_and_overlapping_windows() -> None:
    clock = VirtualClock()
    gpu = _gpu(clock)
    monitor = ZeusMonitor(gpus=[gpu], time_fn=clock)
    monitor.begin_window("outer")
    a = gpu.execute(WORK)
    monitor.begin_window("inner")
    b = gpu.execute(WORK)
    monitor.begin_window("overlap")
    c = gpu.execute(WORK)
    inner = monitor.end_window("inner")
    d = gpu.execute(WORK)
    overlap = monitor.end_window("overlap")
    outer = monitor.end_window("outer")
    assert inner.time_s == pytest.approx(b.time_s + c.time_s)
    assert overlap.time_s == pytest.approx(c.time_s + d.time_s)
    assert outer.time_s == pytest.approx(a.time_s + b.time_s + c.time_s + d.time_s)
    assert outer.total_energy_j == pytest.approx(sum(r.energy_j for r in (a, b, c, d)), abs=4e-3)
    assert monitor.open_windows() == []


def test_window_misuse_is_a_clear_error() -> None:
    clock = VirtualClock()
    monitor = ZeusMonitor(gpus=[_gpu(clock)], time_fn=clock)
    monitor.begin_window("a")
    with pytest.raises(ZeusMonitorError, match="'a' is already open"):
        monitor.begin_window("a")
    with pytest.raises(ZeusMonitorError, match=r"'b' is not open; open windows: \['a'\]"):
        monitor.end_window("b")


def test_cancelled_window_returns_zeros_and_closes() -> None:
    clock = VirtualClock()
    gpu = _gpu(clock)
    monitor = ZeusMonitor(gpus=[gpu], time_fn=clock)
    monitor.begin_window("a")
    gpu.execute(WORK)
    m = monitor.end_window("a", cancel=True)
    assert m.time_s == 0.0 and m.gpu_energy_j == {0: 0.0}
    monitor.begin_window("a")  # The name is free again.


def test_mixed_gpus_each_use_their_own_source() -> None:
    clock = VirtualClock()
    with_counter = _gpu(clock, 0)
    without = _gpu(clock, 1, energy_counter=False)
    monitor = ZeusMonitor(gpus=[with_counter, without], time_fn=clock)
    monitor.begin_window("w")
    clock.advance(2.0)  # Both idle for 2 s.
    m = monitor.end_window("w")
    assert m.gpu_energy_j[0] == pytest.approx(2.0 * with_counter.idle_power_w, abs=1e-3)
    assert m.gpu_energy_j[1] == pytest.approx(2.0 * without.idle_power_w, abs=1e-3)
    assert m.total_energy_j == pytest.approx(4.0 * with_counter.idle_power_w, abs=2e-3)


def test_polling_thread_samples_in_real_time_and_stops() -> None:
    # Real clock, sleeps; ideal sensors: the polling's own error is under test.
    gpu = EmulatedGPU(0, gpu_type="A40", energy_counter=False, sensors="ideal")
    monitor = ZeusMonitor(gpus=[gpu], poll_interval_s=0.01)
    monitor.begin_window("w")
    result = gpu.execute(Workload(compute_s_at_max=0.15))
    time.sleep(0.05)
    m = monitor.end_window("w")
    assert monitor._integrator is not None and monitor._integrator._thread is None
    busy_j = result.energy_j
    idle_j = (m.time_s - result.time_s) * gpu.idle_power_w
    # Sampled every 10 ms: within a few samples' worth of the true energy.
    assert m.total_energy_j == pytest.approx(busy_j + idle_j, rel=0.15)


def test_gpu_selection_and_bad_arguments() -> None:
    clock = VirtualClock()
    gpus = [_gpu(clock, 0), _gpu(clock, 1)]
    assert ZeusMonitor([1], gpus=gpus, time_fn=clock).gpu_indices == [1]
    with pytest.raises(ZeusConfigError, match=r"\[3\] are not among the given GPUs \[0, 1\]"):
        ZeusMonitor([3], gpus=gpus)
    with pytest.raises(ZeusConfigError, match="poll_interval_s"):
        ZeusMonitor(gpus=gpus, poll_interval_s=0)
    with pytest.raises(ZeusConfigError, match="at least one GPU"):
        ZeusMonitor(gpus=[])


def test_monitor_opens_emulated_gpus_by_index() -> None:
    monitor = ZeusMonitor([0, 1], backend="emulated")
    assert monitor.gpu_indices == [0, 1]
    assert all(isinstance(g, EmulatedGPU) for g in monitor.gpus)


def test_without_driver_or_opt_in_the_monitor_refuses_naming_the_opt_in(
    no_driver_no_opt_in,
) -> None:
    with pytest.raises(GPUInitError, match=r"never emulates.*ZEUS_GPU_BACKEND=emulated"):
        ZeusMonitor(gpu_indices=[0])


def test_measurements_on_emulated_gpus_say_so(monkeypatch) -> None:
    monkeypatch.setenv("ZEUS_GPU_BACKEND", "emulated")  # the opt-in, as a user would set it
    monitor = ZeusMonitor(gpu_indices=[0])
    assert monitor.emulated
    monitor.begin_window("w")
    monitor.begin_window("cancelled")
    assert monitor.end_window("w").emulated
    assert monitor.end_window("cancelled", cancel=True).emulated


def test_aggregate_without_process_group_is_identity() -> None:
    assert aggregate_over_ranks(1.5, 20.0) == (1.5, 20.0)


def test_a_long_window_on_real_sensors_is_within_a_refresh_of_the_truth() -> None:
    """What a user sees: the counter refreshes every 100 ms, so a window is off by at most
    about one refresh's energy at each end; over 20 s that is under 1 %."""
    clock = VirtualClock(1.0)
    gpu = EmulatedGPU(0, gpu_type="A40", clock=clock, seed=0)  # real sensors, the default
    monitor = ZeusMonitor(gpus=[gpu], time_fn=clock)
    monitor.begin_window("w")
    runs = [gpu.execute(WORK) for _ in range(160)]
    m = monitor.end_window("w")
    exact = sum(r.energy_j for r in runs)
    assert m.time_s == pytest.approx(sum(r.time_s for r in runs)) and m.time_s > 19
    assert m.gpu_energy_j[0] == pytest.approx(exact, rel=0.01)
    assert m.gpu_energy_j[0] != pytest.approx(exact, abs=1e-3)  # but not to the mJ
