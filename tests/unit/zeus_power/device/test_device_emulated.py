"""The DVFS model and the emulated GPU: curve shapes, limits, the energy counter, errors."""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest

from zeus_power.device.base import GPUNotSupportedError, GPUPermissionError, GPUValueError
from zeus_power.device.emulated import (
    DVFSModel,
    EmulatedGPU,
    VirtualClock,
    Workload,
)
from zeus_power.device.specs import GPU_SPECS, GPUSpec, get_gpu_spec, gpu_type_names

GPU_TYPES = sorted(GPU_SPECS)
WORK = Workload(compute_s_at_max=0.1, memory_s=0.03, activity=0.8)


@pytest.mark.parametrize(
    ("gpu_type", "max_mhz", "min_mhz", "limits_w"),
    [
        ("A100-SXM", 1410, 210, (100, 400, 400)),
        ("A40", 1740, 210, (100, 300, 300)),
        ("H100-SXM", 1980, 345, (200, 700, 700)),
    ],
)
def test_real_clock_and_power_ranges(gpu_type, max_mhz, min_mhz, limits_w):
    gpu = EmulatedGPU(0, gpu_type=gpu_type)
    clocks = gpu.supported_sm_clocks_mhz()
    assert clocks[0] == max_mhz and clocks[-1] == min_mhz
    assert set(np.diff(clocks)) == {-15}
    assert gpu.supported_sm_clocks_mhz(gpu.supported_memory_clocks_mhz()[0]) == clocks
    low, high, default = limits_w
    assert gpu.power_limit_constraints_mw() == (low * 1000, high * 1000)
    assert gpu.default_power_limit_mw() == gpu.get_power_limit_mw() == default * 1000
    assert gpu.max_power_w == high
    assert gpu.idle_power_w < gpu.p2p_block_power_w < gpu.max_power_w


def test_measured_p2p_block_powers():
    assert get_gpu_spec("A40").p2p_block_power_w == 70.38
    assert get_gpu_spec("a100").p2p_block_power_w == 83.64


@pytest.mark.parametrize("gpu_type", GPU_TYPES)
def test_time_falls_and_power_rises_with_frequency(gpu_type):
    model = DVFSModel(gpu_type)
    clocks = model.supported_sm_clocks_mhz()
    times = [model.time_s(WORK, f) for f in clocks]
    powers = [model.power_w(WORK, f) for f in clocks]
    assert all(a < b for a, b in itertools.pairwise(times))  # clocks descend
    assert all(a > b for a, b in itertools.pairwise(powers))
    # T = compute·f_max/f + memory exactly.
    f = clocks[len(clocks) // 2]
    assert model.time_s(WORK, f) == pytest.approx(0.1 * clocks[0] / f + 0.03)


@pytest.mark.parametrize("gpu_type", GPU_TYPES)
def test_energy_is_u_shaped(gpu_type):
    model = DVFSModel(gpu_type)
    clocks = model.supported_sm_clocks_mhz()
    best = model.energy_optimal_freq_mhz(WORK)
    assert clocks[-1] < best < clocks[0]
    energies = {f: model.energy_j(WORK, f) for f in clocks}
    assert energies[clocks[0]] > energies[best] * 1.05
    assert energies[clocks[-1]] > energies[best] * 1.05
    # Unimodal: energy falls towards the optimum from both sides.
    left = [energies[f] for f in clocks if f >= best]
    right = [energies[f] for f in clocks if f <= best]
    assert all(a >= b for a, b in itertools.pairwise(left))
    assert all(a <= b for a, b in itertools.pairwise(right))


def test_power_limit_caps_the_effective_frequency():
    model = DVFSModel("A100-SXM")
    heavy = Workload(0.1, 0.0, activity=1.0)
    uncapped = model.run(heavy)
    assert uncapped.freq_mhz == 1410
    limit_w = uncapped.power_w * 0.7
    capped = model.run(heavy, 1410, limit_w)
    assert capped.power_w <= limit_w
    assert capped.freq_mhz < 1410 and capped.time_s > uncapped.time_s
    # The highest such clock: one step up would exceed the limit.
    assert model.power_w(heavy, capped.freq_mhz + 15) > limit_w
    # A locked clock below the cap is unaffected by the limit.
    assert model.run(heavy, 600, limit_w).freq_mhz == 600
    # An impossible limit leaves the GPU at its minimum clock.
    assert model.effective_freq_mhz(heavy, None, 1.0) == 210


def test_stretch_factor_and_off_grid_clocks():
    model = DVFSModel("A40")
    assert model.stretch_factor(WORK, 1740) == pytest.approx(1.0)
    assert model.stretch_factor(WORK, 870) > 1.5
    # A pure memory-bound instruction does not stretch at all.
    assert model.stretch_factor(Workload(0.0, 1.0), 870) == pytest.approx(1.0)
    assert model.floor_clock_mhz(1001) == 990
    with pytest.raises(GPUValueError, match="outside"):
        model.time_s(WORK, 2000)


def test_workload_validation_and_memory_fraction():
    w = Workload.from_memory_fraction(0.25, time_s_at_max=2.0, activity=0.9)
    assert (w.compute_s_at_max, w.memory_s, w.memory_fraction) == (1.5, 0.5, 0.25)
    assert w.scaled(2).time_s_at_max == 4.0
    for bad in (
        dict(compute_s_at_max=-1.0),
        dict(compute_s_at_max=0.0),
        dict(compute_s_at_max=1.0, activity=0.0),
    ):
        with pytest.raises(GPUValueError):
            Workload(**bad)
    with pytest.raises(GPUValueError, match="memory_fraction"):
        Workload.from_memory_fraction(1.5)
    with pytest.raises(GPUValueError, match="nan"):
        Workload(float("nan"))


def test_execute_advances_virtual_clock_and_counts_energy():
    clock = VirtualClock(100.0)
    gpu = EmulatedGPU(0, gpu_type="A40", clock=clock)
    start_mj = gpu.total_energy_mj()
    result = gpu.execute(WORK)
    assert clock() == pytest.approx(100.0 + result.time_s)
    assert gpu.total_energy_mj() - start_mj == pytest.approx(result.energy_j * 1000, abs=1)
    assert gpu.power_usage_mw() == round(result.power_w * 1000)
    clock.advance(10.0)
    assert gpu.power_usage_mw() == round(gpu.idle_power_w * 1000)
    assert gpu.total_energy_mj() - start_mj == pytest.approx(
        (result.energy_j + 10.0 * gpu.idle_power_w) * 1000, abs=1
    )


def test_gpus_on_one_virtual_clock_can_run_side_by_side():
    clock = VirtualClock()
    gpus = [EmulatedGPU(i, gpu_type="A40", clock=clock) for i in range(2)]
    runs = [gpu.execute(WORK.scaled(i + 1), wait=False) for i, gpu in enumerate(gpus)]
    assert clock() == 0.0
    clock.advance(max(r.time_s for r in runs))
    energies = [gpu.total_energy_mj() for gpu in gpus]
    assert energies[0] == pytest.approx(
        (runs[0].energy_j + gpus[0].idle_power_w * (runs[1].time_s - runs[0].time_s)) * 1000, abs=1
    )
    assert energies[1] == pytest.approx(runs[1].energy_j * 1000, abs=1)


def test_locked_clock_and_power_limit_drive_execute():
    clock = VirtualClock()
    gpu = EmulatedGPU(0, gpu_type="A100-SXM", clock=clock)
    fast = gpu.execute(WORK)
    gpu.lock_sm_clocks(900, 1000)
    assert gpu.current_sm_clock_mhz() == 990
    slow = gpu.execute(WORK)
    assert slow.freq_mhz == 990 and slow.time_s > fast.time_s and slow.energy_j < fast.energy_j
    gpu.reset_sm_clocks()
    gpu.set_power_limit_mw(150_000)
    capped = gpu.execute(WORK)
    assert capped.power_w <= 150 and capped.freq_mhz < fast.freq_mhz
    assert gpu.stretch_factor(WORK) == pytest.approx(1.0)  # relative to max clock, same limit
    assert gpu.busy_power_w(0.3) <= 150


def test_real_clock_execute_sleeps_unless_told_not_to():
    gpu = EmulatedGPU(0, gpu_type="A40")
    tiny = Workload(0.002, 0.0)
    before = gpu.clock()
    gpu.execute(tiny)
    assert gpu.clock() - before >= gpu.model.time_s(tiny, 1740, 300)
    quick = EmulatedGPU(0, gpu_type="A40", sleep=False)
    long = Workload(30.0, 0.0)
    start_mj = quick.total_energy_mj()
    result = quick.execute(long)  # would take 30 s if it slept
    assert quick.total_energy_mj() - start_mj >= (result.power_w - quick.idle_power_w) * 30.0 * 1000


def test_record_busy_for_real_work_done_elsewhere():
    clock = VirtualClock()
    gpu = EmulatedGPU(0, gpu_type="A40", clock=clock)
    power_w = gpu.busy_power_w(0.3, 1200)
    clock.advance(0.5)
    gpu.record_busy(0.5, power_w)
    assert gpu.total_energy_mj() == pytest.approx(power_w * 0.5 * 1000, abs=1)
    before = gpu.total_energy_mj()
    gpu.record_busy(1.0, 1.0)  # below idle: adds nothing, never runs backwards
    assert gpu.total_energy_mj() == before
    with pytest.raises(GPUValueError, match="duration_s"):
        gpu.record_busy(-1.0, 100.0)


def test_energy_counter_is_monotone_under_concurrent_use():
    gpu = EmulatedGPU(0, gpu_type="A40", sleep=False)
    readings: list[int] = []

    def work() -> None:
        for _ in range(200):
            gpu.execute(WORK)
            gpu.record_busy(0.01, 200.0)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        readings.append(gpu.total_energy_mj())
    for t in threads:
        t.join()
    readings.append(gpu.total_energy_mj())
    assert readings == sorted(readings)
    assert readings[-1] >= 600 * WORK.time_s_at_max * 100 * 1000 * 0.9  # >= ~busy energy


def test_noise_is_seeded_and_off_by_default():
    def runs(seed, noise):
        gpu = EmulatedGPU(0, gpu_type="A40", clock=VirtualClock(), seed=seed, noise=noise)
        return [gpu.execute(WORK) for _ in range(5)]

    exact = runs(None, 0.0)
    assert len({r.time_s for r in exact}) == 1
    noisy = runs(7, 0.05)
    assert runs(7, 0.05) == noisy
    assert runs(8, 0.05) != noisy
    assert len({r.time_s for r in noisy}) == 5
    assert all(r.energy_j == pytest.approx(r.power_w * r.time_s) for r in noisy)


def test_bad_clock_and_power_values():
    gpu = EmulatedGPU(3, gpu_type="A40", clock=VirtualClock())
    with pytest.raises(GPUValueError, match=r"GPU 3: .*outside the supported range"):
        gpu.lock_sm_clocks(100, 1000)
    with pytest.raises(GPUValueError, match="exceeds"):
        gpu.lock_sm_clocks(1200, 1100)
    with pytest.raises(GPUValueError, match="No supported SM clock"):
        gpu.lock_sm_clocks(1201, 1209)
    with pytest.raises(GPUValueError, match=r"100000\.\.300000 mW"):
        gpu.set_power_limit_mw(400_000)
    with pytest.raises(GPUValueError, match="Memory clock"):
        gpu.supported_sm_clocks_mhz(1)
    assert gpu.get_power_limit_mw() == 300_000 and gpu.current_sm_clock_mhz() == 1740


def test_unprivileged_and_counterless_gpus():
    gpu = EmulatedGPU(0, gpu_type="A40", privileged=False, energy_counter=False)
    with pytest.raises(GPUPermissionError, match="sudo"):
        gpu.lock_sm_clocks(1200, 1200)
    with pytest.raises(GPUPermissionError, match="SYS_ADMIN"):
        gpu.set_power_limit_mw(200_000)
    assert not gpu.supports_energy_counter()
    with pytest.raises(GPUNotSupportedError, match="power_usage_mw"):
        gpu.total_energy_mj()
    assert gpu.power_usage_mw() == round(gpu.idle_power_w * 1000)


def test_virtual_clock_only_moves_forward():
    clock = VirtualClock()
    assert clock.advance(1.5) == clock() == clock.now_s == 1.5
    with pytest.raises(GPUValueError, match="forward"):  # a ValueError too, as it was
        clock.advance(-1)
    with pytest.raises(ValueError, match="finite"):
        VirtualClock(float("nan"))


def test_spec_registry_and_validation():
    assert gpu_type_names() == sorted(GPU_SPECS) and {"A100-SXM", "A40", "H100-SXM"} <= set(
        GPU_SPECS
    )
    assert get_gpu_spec(" h100 ") is GPU_SPECS["H100-SXM"]
    with pytest.raises(GPUValueError, match=r"'V100'.*A100-SXM, A40, H100-SXM"):
        get_gpu_spec("V100")
    with pytest.raises(TypeError):
        GPU_SPECS["X"] = GPU_SPECS["A40"]  # type: ignore[index]
    with pytest.raises(GPUValueError, match="knee_mhz"):
        GPUSpec(**{**_fields(GPU_SPECS["A40"]), "knee_mhz": 5000.0})


def _fields(spec: GPUSpec) -> dict:
    from dataclasses import fields

    return {f.name: getattr(spec, f.name) for f in fields(spec)}


# -- switching latency -------------------------------------------------------------------
def test_a_new_clock_takes_the_switching_latency_to_come_into_force():
    clock = VirtualClock()
    gpu = EmulatedGPU(0, gpu_type="A40", clock=clock, switch_latency_s=0.015)
    gpu.lock_sm_clocks(900, 900)
    assert gpu.current_sm_clock_mhz() == 1740 and gpu.target_sm_clock_mhz() == 900
    assert gpu.switch_lag() == (1740, pytest.approx(0.015))
    clock.advance(0.010)
    assert gpu.current_sm_clock_mhz() == 1740
    assert gpu.switch_lag(0.010) == (1740, pytest.approx(0.015))  # seen from the request
    clock.advance(0.005)
    assert gpu.current_sm_clock_mhz() == 900 and gpu.switch_lag() == (900, 0.0)
    gpu.lock_sm_clocks(900, 900)  # the clock already asked for: no new switch
    assert gpu.switch_lag() == (900, 0.0)


def test_work_after_a_change_runs_its_first_latency_at_the_old_clock():
    clock = VirtualClock()
    gpu = EmulatedGPU(0, gpu_type="A40", clock=clock, switch_latency_s=0.015)
    model, limit = gpu.model, gpu.power_limit_w()
    old, new = model.run(WORK, 1740, limit), model.run(WORK, 900, limit)
    gpu.lock_sm_clocks(900, 900)
    start_mj = gpu.total_energy_mj()
    run = gpu.execute(WORK)
    left = 1 - 0.015 / old.time_s  # share of the work done at the new clock
    assert run.time_s == pytest.approx(0.015 + left * new.time_s)
    assert run.energy_j == pytest.approx(old.power_w * 0.015 + left * new.energy_j)
    assert old.time_s < run.time_s < new.time_s  # neither clock's time
    assert (gpu.total_energy_mj() - start_mj) / 1e3 == pytest.approx(run.energy_j, abs=2e-3)
    # Work shorter than the latency runs at the old clock entirely.
    short = Workload(compute_s_at_max=0.002, memory_s=0.001)
    gpu.lock_sm_clocks(1200, 1200)
    assert gpu.execute(short).time_s == pytest.approx(model.run(short, 900, limit).time_s)


def test_without_latency_a_change_is_immediate():
    gpu = EmulatedGPU(0, gpu_type="A40", clock=VirtualClock())
    gpu.lock_sm_clocks(900, 900)
    assert gpu.current_sm_clock_mhz() == 900 and gpu.switch_lag() == (900, 0.0)
    assert gpu.execute(WORK).time_s == pytest.approx(gpu.model.time_s(WORK, 900, 300))


def test_switching_latency_comes_from_the_environment(monkeypatch):
    from zeus_power.device import DEFAULT_SWITCH_LATENCY_MS, open_gpus

    monkeypatch.delenv("ZEUS_EMULATED_SWITCH_LATENCY_MS", raising=False)
    assert open_gpus(backend="emulated")[0].switch_latency_s == DEFAULT_SWITCH_LATENCY_MS / 1e3
    monkeypatch.setenv("ZEUS_EMULATED_SWITCH_LATENCY_MS", "20")
    assert open_gpus(backend="emulated")[0].switch_latency_s == pytest.approx(0.020)
    monkeypatch.setenv("ZEUS_EMULATED_SWITCH_LATENCY_MS", "-1")
    with pytest.raises(GPUValueError, match="ZEUS_EMULATED_SWITCH_LATENCY_MS"):
        open_gpus(backend="emulated")
    with pytest.raises(GPUValueError, match="switch_latency_s"):
        EmulatedGPU(0, switch_latency_s=-0.1)
