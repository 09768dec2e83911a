"""The per-rank hook's parts that need no coordinator: clocks, emulation, bad setups."""

from __future__ import annotations

import threading
import time

import pytest
from paths import require_module
from server_fixtures import single_rank_layout

from perseus.client import (
    EmulationSettings,
    FrequencyController,
    InstructionEmulator,
    PerseusOptimizer,
)
from perseus.demo import free_port
from perseus.errors import ConfigurationError, CoordinatorError, DeviceError, PerseusError
from zeus_power.device.base import GPUInitError, GPUPermissionError
from zeus_power.device.emulated import EmulatedGPU, Workload

torch = require_module("torch")
dist = require_module("torch.distributed")


def test_frequency_controller_applies_the_latest_clock_and_always_resets():
    gpu = EmulatedGPU(0)
    ctl = FrequencyController(gpu)
    for freq in (1410, 1200, 900, 705):
        ctl.request(freq)
    ctl.wait_applied()
    assert gpu.current_sm_clock_mhz() == 705
    ctl.request(1005)
    ctl.wait_applied()
    assert gpu.current_sm_clock_mhz() == 1005
    ctl.close()
    assert gpu.current_sm_clock_mhz() == gpu.spec.max_sm_clock_mhz  # reset on close
    ctl.close()  # idempotent


def test_frequency_controller_raises_gpu_errors_in_the_caller():
    ctl = FrequencyController(EmulatedGPU(0, privileged=False))
    ctl.request(900)
    with pytest.raises(GPUPermissionError, match="root"):
        ctl.wait_applied()
    with pytest.raises(GPUPermissionError):  # resetting clocks needs privileges too
        ctl.close()


def test_inline_frequency_controller_locks_in_the_callers_thread():
    gpu = EmulatedGPU(0)
    ctl = FrequencyController(gpu, inline=True)
    for freq in (1410, 900, 705):
        ctl.request(freq)
        assert gpu.current_sm_clock_mhz() == freq  # in force on return, no wait needed
    ctl.wait_applied()
    assert not any(t.name.startswith("perseus-freq-") for t in threading.enumerate())
    ctl.close()
    assert gpu.current_sm_clock_mhz() == gpu.spec.max_sm_clock_mhz  # reset on close
    with pytest.raises(GPUPermissionError, match="root"):
        FrequencyController(EmulatedGPU(0, privileged=False), inline=True).request(900)


@pytest.mark.parametrize("freq", [1410, 1005, 600])
def test_measured_emulation_stretches_wall_time_and_feeds_the_counter(freq, tmp_path):
    gpu = EmulatedGPU(0, sensors="ideal")  # exact energy: what the emulator books is under test
    emulator = InstructionEmulator(
        gpu, EmulationSettings(memory_fraction=0.2, truth=tmp_path), rank=3, stage=2
    )
    work = emulator.workload("forward")  # the preset's activity, memory fraction 0.2
    assert work.memory_fraction == pytest.approx(0.2)
    stretch = gpu.model.stretch_factor(work, freq)
    start_mj = gpu.total_energy_mj()
    emulator.begin("forward", freq)
    start = time.perf_counter()
    time.sleep(0.02)  # the "real work"
    compute_end = time.perf_counter()
    duration = emulator.finish("forward", start, freq, compute_end_s=compute_end)
    wall = time.perf_counter() - start
    energy_j = (gpu.total_energy_mj() - start_mj) / 1000
    target = (compute_end - start) * stretch
    assert emulator.last_compute_s == compute_end - start
    # At least the stretched time; more only by the host's late wake-up (loaded CI machine).
    assert target <= duration <= wall < target + 0.05
    power = gpu.busy_power_w(work, freq)
    assert energy_j == pytest.approx(power * duration, rel=0.05)
    emulator.close()
    # The truth file holds the model's numbers before any sensor effect.
    lines = (tmp_path / "rank3.csv").read_text().splitlines()
    assert lines[0] == "stage,instruction,frequency,time,energy,switching"
    stage, kind, f, t, e, switching = lines[1].split(",")
    assert (stage, kind, int(f), float(t)) == ("2", "forward", freq, duration)
    assert switching == "0"  # the clock was in force before the instruction began
    assert float(e) == pytest.approx(power * duration)


def test_kinds_draw_different_power_and_slow_down_differently():
    gpu = EmulatedGPU(0)
    emulator = InstructionEmulator(gpu, EmulationSettings())  # the GPT-3 preset
    fwd, bwd = emulator.workload("forward"), emulator.workload("backward")
    assert fwd.activity > bwd.activity and fwd.memory_fraction < bwd.memory_fraction
    assert gpu.busy_power_w(fwd, 1410) > gpu.busy_power_w(bwd, 1410)
    assert gpu.stretch_factor(fwd, 705) > gpu.stretch_factor(bwd, 705) > 1.0
    assert emulator.workload("backward_weight") == bwd  # the halves take the backward's
    uniform = InstructionEmulator(gpu, EmulationSettings(kinds="uniform"))
    assert uniform.workload("forward") == uniform.workload("backward") == Workload(1.0)


def test_nominal_emulation_ignores_the_measured_time():
    gpu = EmulatedGPU(0)
    emulator = InstructionEmulator(
        gpu, EmulationSettings(nominal=True), nominal_time_s={"forward": 0.01, "backward": 0.02}
    )
    stretch = gpu.stretch_factor(emulator.workload("backward"), 705)
    assert 1.0 < stretch < 1410 / 705  # part of the backward is memory-bound
    emulator.begin("backward", 705)
    duration = emulator.finish("backward", time.perf_counter(), 705)
    assert duration == pytest.approx(0.02 * stretch, rel=0.05)
    with pytest.raises(ConfigurationError, match="No nominal time for instruction 'optimizer'"):
        emulator.finish("optimizer", time.perf_counter(), 705)


def test_a_compute_that_overruns_its_nominal_time_is_the_hosts_not_the_gpus():
    # A busy host computes a 10 ms instruction in 30 ms: the emulated GPU ran its 10 ms (the
    # instruction's time and energy), idle after; the wall time holds the rest.
    gpu = EmulatedGPU(0, sensors="ideal")
    emulator = InstructionEmulator(
        gpu, EmulationSettings(nominal=True, kinds="uniform"), nominal_time_s={"forward": 0.01}
    )
    top = gpu.spec.max_sm_clock_mhz
    start = time.perf_counter()
    emulator.begin("forward", top)
    time.sleep(0.03)
    duration = emulator.finish("forward", start, top)
    assert time.perf_counter() - start >= 0.03
    assert duration == pytest.approx(0.01, rel=1e-6)
    assert emulator.last_compute_s >= 0.03


def test_stretching_off_measures_only():
    gpu = EmulatedGPU(0)
    emulator = InstructionEmulator(gpu, EmulationSettings(stretch=False))
    start = time.perf_counter()
    duration = emulator.finish("forward", start, 210)
    assert duration < 0.005  # no sleep at the lowest clock


def test_emulation_settings_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("PERSEUS_EMULATE_STRETCH", "0")
    monkeypatch.setenv("PERSEUS_EMULATE_NOMINAL", "1")
    settings = EmulationSettings()
    assert settings.stretch is False and settings.nominal is True
    with pytest.raises(ConfigurationError, match="no nominal instruction times"):
        InstructionEmulator(EmulatedGPU(0), settings)
    with pytest.raises(ConfigurationError, match="positive number of seconds"):
        InstructionEmulator(EmulatedGPU(0), settings, nominal_time_s={"forward": -1.0})
    monkeypatch.setenv("PERSEUS_EMULATE_NOMINAL_MS", '{"forward": 10, "backward@1": 30}')
    emulator = InstructionEmulator(EmulatedGPU(0), EmulationSettings())
    assert emulator.nominal_time_s == {"forward": 0.01, "backward@1": 0.03}
    monkeypatch.setenv("PERSEUS_EMULATE_NOMINAL_MS", '{"forward": -5}')
    with pytest.raises(ValueError, match="greater than 0"):
        EmulationSettings()


def test_hook_needs_a_process_group():
    with pytest.raises(ConfigurationError, match="init_process_group"):
        PerseusOptimizer(**single_rank_layout(), gpu=EmulatedGPU(0))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"world_size": 2}, r"1·1·1 != world_size 2"),
        ({"pp_rank": 1}, r"pp_rank=1 must be in \[0, 1\)"),
        ({"server_url": "127.0.0.1:7787"}, "must be an http"),
        ({"dp_degree": 0, "world_size": 0}, "dp_degree=0"),
    ],
)
def test_bad_layouts_are_named(overrides, message):
    with pytest.raises(ConfigurationError, match=message):
        PerseusOptimizer(**single_rank_layout(**overrides), gpu=EmulatedGPU(0))


def test_without_driver_or_opt_in_the_hook_refuses_naming_the_opt_in(
    process_group, no_driver_no_opt_in
):
    """No silent emulation: a hook that must open its GPU, on a machine without an NVIDIA
    driver and without ZEUS_GPU_BACKEND=emulated, fails before it contacts the coordinator,
    with a `PerseusError` (the one root a user catches) caused by the device layer's."""
    with pytest.raises(DeviceError, match=r"never emulates.*ZEUS_GPU_BACKEND=emulated") as err:
        PerseusOptimizer(**single_rank_layout())
    assert isinstance(err.value, PerseusError) and isinstance(err.value.__cause__, GPUInitError)


def test_unreachable_coordinator_names_the_url(process_group, monkeypatch):
    monkeypatch.setenv("PERSEUS_RECONNECT_S", "0")  # no wait for a restart
    url = f"http://127.0.0.1:{free_port()}"
    gpu = EmulatedGPU(0)
    with pytest.raises(CoordinatorError, match=f"Cannot reach the Perseus coordinator at {url}"):
        PerseusOptimizer(**single_rank_layout(server_url=url), gpu=gpu, timeout_s=5)
    assert gpu.current_sm_clock_mhz() == gpu.spec.max_sm_clock_mhz


@pytest.mark.parametrize(
    ("timing", "env", "message"),
    [
        ("cuda", None, r"timing='cuda' \(PERSEUS_TIMING\) is not one of auto, sync, events"),
        (None, "event", r"timing='event' \(PERSEUS_TIMING\) is not one of auto, sync, events"),
        ("events", None, "needs a real GPU with an energy counter"),
    ],
)
def test_a_timing_the_gpu_cannot_do_is_refused(process_group, monkeypatch, timing, env, message):
    if env is not None:
        monkeypatch.setenv("PERSEUS_TIMING", env)
    with pytest.raises(ConfigurationError, match=message):
        PerseusOptimizer(**single_rank_layout(), gpu=EmulatedGPU(0), timing=timing)
