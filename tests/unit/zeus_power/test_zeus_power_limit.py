"""GlobalPowerLimitOptimizer step by step on emulated A40s (virtual clock), and its selectors."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from zeus_power.device.base import GPUValueError
from zeus_power.device.emulated import EmulatedGPU, VirtualClock, Workload
from zeus_power.errors import ZeusConfigError, ZeusProfileError
from zeus_power.monitor import ZeusMonitor
from zeus_power.power_limit import (
    Done,
    Energy,
    GlobalPowerLimitOptimizer,
    MaxSlowdownConstraint,
    PowerLimitMeasurement,
    Profiling,
    Ready,
    ShortEpochWarning,
    Time,
    Warmup,
    ZeusCost,
)

STEP = Workload(compute_s_at_max=0.05, memory_s=0.01)
A40_LIMITS = [300, 250, 200, 150, 100]  # A40: 100..300 W, pl_step=50


class RecordingGPU(EmulatedGPU):
    """An emulated GPU that records every power limit set on it (in W)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.limits_set_w: list[float] = []

    def set_power_limit_mw(self, limit_mw: int) -> None:
        super().set_power_limit_mw(limit_mw)
        self.limits_set_w.append(limit_mw / 1000)


def _setup(n_gpus: int = 1, **gpu_kwargs) -> tuple[VirtualClock, list[RecordingGPU], ZeusMonitor]:
    """Ideal sensors: the state machine's choices are checked against exact measurements."""
    clock = VirtualClock()
    gpu_kwargs.setdefault("sensors", "ideal")
    gpus = [RecordingGPU(i, gpu_type="A40", clock=clock, **gpu_kwargs) for i in range(n_gpus)]
    return clock, gpus, ZeusMonitor(gpus=gpus, time_fn=clock)


def _train(opt: GlobalPowerLimitOptimizer, gpus, steps_per_epoch: int, epochs: int) -> None:
    for _ in range(epochs):
        for _ in range(steps_per_epoch):
            opt.on_step_begin()
            for gpu in gpus:
                gpu.execute(STEP)
        opt.on_epoch_end()


def test_state_machine_step_by_step() -> None:
    _, (gpu,), monitor = _setup()
    opt = GlobalPowerLimitOptimizer(
        monitor, Time(), wait_steps=2, warmup_steps=2, profile_steps=3, pl_step=50
    )
    assert opt.power_limits == A40_LIMITS
    assert opt.state == Ready(next_power_limit_w=300, steps=2)
    assert gpu.limits_set_w == [300]  # The constructor starts from the max limit.

    expected = [
        Ready(next_power_limit_w=300, steps=1),  # step 1: waiting
        Warmup(current_power_limit_w=300, steps=2),  # step 2: limit set, warmup begins
        Warmup(current_power_limit_w=300, steps=1),
        Profiling(current_power_limit_w=300, steps=3),  # warmup window ends
        Profiling(current_power_limit_w=300, steps=2),
        Profiling(current_power_limit_w=300, steps=1),
        Warmup(current_power_limit_w=250, steps=2),  # 300 W measured, next limit
    ]
    for state in expected:
        opt.on_step_begin()
        gpu.execute(STEP)
        assert opt.state == state
    assert [m.power_limit_w for m in opt.measurements] == [300]
    assert monitor.open_windows() == ["__GlobalPowerLimitOptimizer_warmup_250"]
    # The 300 W profiling window covered exactly the 3 profiled steps.
    step_at_max = gpu.model.run(STEP, gpu.spec.max_sm_clock_mhz, 300.0)
    assert opt.measurements[0].time_s == pytest.approx(3 * step_at_max.time_s)
    assert opt.measurements[0].energy_j == pytest.approx(3 * step_at_max.energy_j, abs=3e-3)

    for _ in range(4 * 5):  # Four more limits, 5 steps each.
        opt.on_step_begin()
        gpu.execute(STEP)
    assert isinstance(opt.state, Done)
    assert [m.power_limit_w for m in opt.measurements] == A40_LIMITS
    assert gpu.limits_set_w == [300, 300, 250, 200, 150, 100, opt.state.optimal_power_limit_w]
    assert opt.state.optimal_power_limit_w == Time().select(opt.measurements)
    assert gpu.get_power_limit_mw() == opt.state.optimal_power_limit_w * 1000
    assert monitor.open_windows() == []
    opt.on_step_begin()
    opt.on_epoch_end()
    assert isinstance(opt.state, Done)  # Final.


def test_interrupted_epochs_retry_the_cut_limit_after_restoring_the_max() -> None:
    _, (gpu,), monitor = _setup()
    opt = GlobalPowerLimitOptimizer(monitor, Energy(), warmup_steps=2, profile_steps=3, pl_step=50)
    # 8 steps per epoch: one limit finishes (steps 1-5), the next is cut at step 8.
    _train(opt, [gpu], steps_per_epoch=8, epochs=6)
    assert isinstance(opt.state, Done)
    assert gpu.limits_set_w == [
        300,  # constructor
        300,
        250,
        300,  # epoch 1: 300 done, 250 cut -> max restored
        250,
        200,
        300,  # epoch 2
        200,
        150,
        300,  # epoch 3
        150,
        100,
        300,  # epoch 4
        100,
        opt.state.optimal_power_limit_w,  # epoch 5: last limit, then the optimum
    ]
    # Retried windows measure the same as uninterrupted ones (the emulator is deterministic).
    _, (gpu2,), monitor2 = _setup()
    clean = GlobalPowerLimitOptimizer(
        monitor2, Energy(), warmup_steps=2, profile_steps=3, pl_step=50
    )
    _train(clean, [gpu2], steps_per_epoch=100, epochs=1)
    assert [m.power_limit_w for m in opt.measurements] == A40_LIMITS
    for cut, whole in zip(opt.measurements, clean.measurements, strict=True):
        assert cut.time_s == pytest.approx(whole.time_s)
        assert cut.energy_j == pytest.approx(whole.energy_j, abs=3e-3)
    assert opt.state.optimal_power_limit_w == clean.state.optimal_power_limit_w


def test_epoch_ending_in_warmup_cancels_the_window() -> None:
    _, (gpu,), monitor = _setup()
    opt = GlobalPowerLimitOptimizer(monitor, warmup_steps=3, profile_steps=3, pl_step=50)
    opt.on_step_begin()
    opt.on_step_begin()
    assert isinstance(opt.state, Warmup)
    with pytest.warns(ShortEpochWarning):
        opt.on_epoch_end()
    assert opt.state == Ready(next_power_limit_w=300, steps=1)
    assert monitor.open_windows() == []
    assert gpu.get_power_limit_mw() == 300_000


def test_short_epochs_warn_once() -> None:
    _, (gpu,), monitor = _setup()
    opt = GlobalPowerLimitOptimizer(monitor, warmup_steps=2, profile_steps=3, pl_step=50)
    with pytest.warns(ShortEpochWarning, match="epoch of 5 steps.*needs 6 steps"):
        _train(opt, [gpu], steps_per_epoch=5, epochs=3)
    assert isinstance(opt.state, Ready) and opt.measurements == []


def test_epochs_just_long_enough_do_not_warn() -> None:
    _, (gpu,), monitor = _setup()
    opt = GlobalPowerLimitOptimizer(monitor, warmup_steps=2, profile_steps=3, pl_step=50)
    _train(opt, [gpu], steps_per_epoch=6, epochs=5)  # warnings are errors in this suite
    assert isinstance(opt.state, Done)


def test_zero_warmup_steps_profile_straight_away() -> None:
    _, (gpu,), monitor = _setup()
    opt = GlobalPowerLimitOptimizer(monitor, warmup_steps=0, profile_steps=2, pl_step=50)
    opt.on_step_begin()
    assert opt.state == Profiling(current_power_limit_w=300, steps=2)
    _train(opt, [gpu], steps_per_epoch=20, epochs=1)
    assert isinstance(opt.state, Done)
    assert [m.power_limit_w for m in opt.measurements] == A40_LIMITS


def test_minimum_power_limit_is_always_a_candidate() -> None:
    _, _, monitor = _setup()
    opt = GlobalPowerLimitOptimizer(monitor, pl_step=75)
    assert opt.power_limits == [300, 225, 150, 100]
    opt = GlobalPowerLimitOptimizer(monitor, pl_step=500)
    assert opt.power_limits == [300, 100]


def test_zero_joule_windows_do_not_crash(caplog: pytest.LogCaptureFixture) -> None:
    _, _, monitor = _setup()
    selectors = [Energy(), Time(), ZeusCost(0.5), MaxSlowdownConstraint(1.1)]
    for selector in selectors:
        opt = GlobalPowerLimitOptimizer(
            monitor, selector, warmup_steps=1, profile_steps=1, pl_step=50
        )
        with caplog.at_level(logging.WARNING, logger="zeus_power.power_limit"):
            for _ in range(20):
                opt.on_step_begin()  # no work: the virtual clock stands still, 0 J, 0 s
        assert isinstance(opt.state, Done)
        assert all(m.energy_j == 0.0 and m.time_s == 0.0 for m in opt.measurements)
    assert "measured 0.000 J" in caplog.text


def test_multi_gpu_windows_sum_energy_and_set_every_gpu() -> None:
    # Each GPU runs on its own virtual clock; identical steps keep the clocks in lockstep,
    # as GPUs of one data-parallel job run side by side.
    clocks = [VirtualClock(), VirtualClock()]
    gpus = [RecordingGPU(i, gpu_type="A40", clock=clocks[i], sensors="ideal") for i in range(2)]
    monitor = ZeusMonitor(gpus=gpus, time_fn=clocks[0])
    opt = GlobalPowerLimitOptimizer(monitor, Energy(), warmup_steps=1, profile_steps=2, pl_step=100)
    _train(opt, gpus, steps_per_epoch=30, epochs=1)
    assert isinstance(opt.state, Done)
    assert gpus[0].limits_set_w == gpus[1].limits_set_w
    _, (single,), monitor1 = _setup()
    one = GlobalPowerLimitOptimizer(
        monitor1, Energy(), warmup_steps=1, profile_steps=2, pl_step=100
    )
    _train(one, [single], steps_per_epoch=30, epochs=1)
    for two_gpus, one_gpu in zip(opt.measurements, one.measurements, strict=True):
        assert two_gpus.energy_j == pytest.approx(2 * one_gpu.energy_j, abs=5e-3)


def test_mixed_gpu_models_are_rejected() -> None:
    clock = VirtualClock()
    gpus = [
        EmulatedGPU(0, gpu_type="A40", clock=clock),
        EmulatedGPU(1, gpu_type="A100-SXM", clock=clock),
    ]
    with pytest.raises(ZeusConfigError, match="Power limit ranges differ"):
        GlobalPowerLimitOptimizer(ZeusMonitor(gpus=gpus, time_fn=clock))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"profile_steps": 0}, "profile_steps must be an integer >= 1"),
        ({"warmup_steps": -1}, "warmup_steps must be an integer >= 0"),
        ({"pl_step": 0}, "pl_step must be an integer >= 1"),
        ({"wait_steps": 1.5}, "wait_steps"),
    ],
)
def test_bad_arguments(kwargs, match) -> None:
    _, _, monitor = _setup()
    with pytest.raises(ZeusConfigError, match=match):
        GlobalPowerLimitOptimizer(monitor, **kwargs)


def test_permission_errors_surface() -> None:
    from zeus_power.device.base import GPUPermissionError

    _, _, monitor = _setup(privileged=False)
    with pytest.raises(GPUPermissionError, match="Setting the power limit"):
        GlobalPowerLimitOptimizer(monitor)


# ------------------------------------------------------------------------- profile file


def test_profile_is_saved_then_loaded_without_profiling(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "profile.json"
    _, (gpu,), monitor = _setup()
    opt = GlobalPowerLimitOptimizer(
        monitor, Energy(), warmup_steps=1, profile_steps=2, pl_step=50, profile_path=path
    )
    _train(opt, [gpu], steps_per_epoch=30, epochs=1)
    assert isinstance(opt.state, Done)
    saved = json.loads(path.read_text())
    assert saved["version"] == 1
    assert saved["optimal_power_limit_w"] == opt.state.optimal_power_limit_w
    assert [m["power_limit_w"] for m in saved["measurements"]] == A40_LIMITS
    assert saved["emulated"] is True  # measured on emulated GPUs, and the file says so

    _, (gpu2,), monitor2 = _setup()
    loaded = GlobalPowerLimitOptimizer(monitor2, Energy(), profile_path=path)
    assert loaded.state == Done(optimal_power_limit_w=opt.state.optimal_power_limit_w)
    assert loaded.measurements == opt.measurements
    assert gpu2.limits_set_w == [300, opt.state.optimal_power_limit_w]
    # A different selector re-selects from the loaded measurements.
    fastest = GlobalPowerLimitOptimizer(monitor2, Time(), profile_path=path)
    assert fastest.state == Done(optimal_power_limit_w=Time().select(opt.measurements))
    loaded.on_step_begin()
    assert monitor2.open_windows() == []


def test_profile_with_zeus_field_names_loads(tmp_path: Path) -> None:
    path = tmp_path / "zeus.json"
    path.write_text(
        json.dumps(
            {
                "measurements": [
                    {"power_limit": 300, "energy": 100.0, "time": 1.0},
                    {"power_limit": 200, "energy": 80.0, "time": 1.4},
                ]
            }
        )
    )
    _, _, monitor = _setup()
    assert GlobalPowerLimitOptimizer(monitor, Energy(), profile_path=path).state == Done(
        optimal_power_limit_w=200
    )


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("not json", "Cannot load the power-limit profile"),
        ('{"measurements": []}', "Cannot load"),
        ('{"measurements": [{"power_limit_w": 300, "energy_j": -1, "time_s": 1}]}', "Cannot load"),
        (
            '{"version": 7, "measurements": [{"power_limit_w": 300, "energy_j": 1, "time_s": 1}]}',
            "version 7",
        ),
        (
            '{"measurements": [{"power_limit_w": 700, "energy_j": 1, "time_s": 1}]}',
            "700 W lies outside",
        ),
    ],
)
def test_bad_profile_files_are_clear_errors(tmp_path: Path, content: str, match: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    _, _, monitor = _setup()
    with pytest.raises(ZeusProfileError, match=match):
        GlobalPowerLimitOptimizer(monitor, profile_path=path)


# ------------------------------------------------------------------------- selectors

# A typical profile: energy is U-shaped in the power limit, time grows as it drops.
TABLE = [
    PowerLimitMeasurement(power_limit_w=300, energy_j=100.0, time_s=1.0),
    PowerLimitMeasurement(power_limit_w=250, energy_j=90.0, time_s=1.1),
    PowerLimitMeasurement(power_limit_w=200, energy_j=85.0, time_s=1.3),
    PowerLimitMeasurement(power_limit_w=150, energy_j=95.0, time_s=1.8),
    PowerLimitMeasurement(power_limit_w=100, energy_j=120.0, time_s=3.0),
]


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        (Energy(), 200),
        (Time(), 300),
        (ZeusCost(1.0), 200),  # pure energy
        (ZeusCost(0.0), 300),  # pure time
        (ZeusCost(0.5), 300),  # 0.5·E + 150·T: 200 < 210 < ...
        (ZeusCost(0.9), 250),  # 90+30=120, 81+33=114, 76.5+39=115.5
        (ZeusCost(0.95), 200),  # 110, 102, 100.25
        (ZeusCost(0.95, world_size=2), 250),  # time weighs double: 125, 118.5, 119.75
        (MaxSlowdownConstraint(1.0), 300),
        (MaxSlowdownConstraint(1.1), 250),
        (MaxSlowdownConstraint(1.3), 200),
        (MaxSlowdownConstraint(2.0), 150),
        (MaxSlowdownConstraint(5.0), 100),
    ],
    ids=repr,
)
def test_selectors_on_a_profile_table(selector, expected: int) -> None:
    assert selector.select(TABLE) == expected
    assert selector.select(list(reversed(TABLE))) == expected  # order does not matter


def test_selectors_on_an_emulated_profile() -> None:
    _, (gpu,), monitor = _setup()
    opt = GlobalPowerLimitOptimizer(monitor, warmup_steps=1, profile_steps=4, pl_step=25)
    _train(opt, [gpu], steps_per_epoch=100, epochs=1)
    table = {m.power_limit_w: m for m in opt.measurements}
    assert min(table) == 100 and max(table) == 300
    assert Time().select(opt.measurements) == min(table, key=lambda p: (table[p].time_s, p))
    energy_best = Energy().select(opt.measurements)
    assert 100 < energy_best < 300  # The DVFS model's energy is U-shaped.
    slow = MaxSlowdownConstraint(1.2).select(opt.measurements)
    assert table[slow].time_s <= 1.2 * table[300].time_s
    assert all(table[p].time_s > 1.2 * table[300].time_s for p in table if p < slow)


def test_selector_arguments_are_checked() -> None:
    with pytest.raises(ZeusConfigError, match="eta_knob"):
        ZeusCost(1.5)
    with pytest.raises(ZeusConfigError, match="world_size"):
        ZeusCost(0.5, world_size=0)
    with pytest.raises(ZeusConfigError, match=r"must be >= 1.0, got 0.9"):
        MaxSlowdownConstraint(0.9)
    with pytest.raises(ZeusConfigError, match="no measurements"):
        Energy().select([])


def test_hf_callback_needs_transformers_or_drives_the_optimizer() -> None:
    import importlib.util

    import zeus_power.power_limit as power_limit

    if importlib.util.find_spec("transformers") is None:
        with pytest.raises(ImportError, match=r"pip install 'perseus-energy\[hf\]'"):
            power_limit.HFGlobalPowerLimitOptimizer  # noqa: B018
        return
    from transformers import TrainerCallback

    _, (gpu,), monitor = _setup()
    callback = power_limit.HFGlobalPowerLimitOptimizer(
        monitor, warmup_steps=1, profile_steps=1, pl_step=100
    )
    assert isinstance(callback, TrainerCallback)
    for _ in range(10):
        callback.on_step_begin(None, None, None)
        gpu.execute(STEP)
    callback.on_epoch_end(None, None, None)
    assert isinstance(callback.optimizer.state, Done)


def test_unknown_module_attribute() -> None:
    import zeus_power.power_limit as power_limit

    with pytest.raises(AttributeError):
        power_limit.NoSuchThing  # noqa: B018


def test_gpu_value_errors_are_device_errors() -> None:
    _, (gpu,), _ = _setup()
    with pytest.raises(GPUValueError):
        gpu.set_power_limit_mw(50_000)
