"""The emulator against the measured A40 profiles, and the fitting routines themselves.

Stated tolerance (see docs/emulator.md): with the shipped A40 curve and one fitted
workload per instruction, every fitted instruction's median time and energy errors are
within 5 %, its worst row within 10 %, and the model's energy-optimal clock lands within
100 MHz of the measured one.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from paths import SHARED_DATA, require_data

from zeus_power.device.base import GPUValueError
from zeus_power.device.calibration import MeasuredSweep, compare, fit_power_curve, fit_workload
from zeus_power.device.emulated import DVFSModel, Workload
from zeus_power.device.specs import get_gpu_spec

DATA = SHARED_DATA
FILES = ["sosp24_gpt3-175b_a40_8stage.csv", "sosp24_bloom-176b_a40_8stage.csv"]


def _measurements(name: str, stages: tuple[int, ...]) -> list[tuple[str, MeasuredSweep]]:
    frame = pd.read_csv(require_data(DATA / name))
    out = []
    for (stage, instruction), group in frame.groupby(["stage", "instruction"]):
        if stage in stages:
            m = MeasuredSweep(
                group["frequency"].to_numpy(), group["time"].to_numpy(), group["energy"].to_numpy()
            )
            out.append((f"{name}:{stage}:{instruction}", m))
    return out


@pytest.mark.parametrize("name", FILES)
def test_emulator_reproduces_the_real_a40_shape(name):
    model = DVFSModel("A40")
    # Stages 0-6 are identical layers; 7 is the last stage.
    for label, m in _measurements(name, (0, 7)):
        workload = fit_workload(model, m)
        q = compare(model, workload, m)
        assert q.time_rel_err_median < 0.05 and q.time_rel_err_max < 0.10, label
        assert q.energy_rel_err_median < 0.05 and q.energy_rel_err_max < 0.10, label
        assert abs(q.model_optimal_freq_mhz - q.measured_optimal_freq_mhz) <= 100, label
        # The default power limit throttles the top clocks, as the flat measured top shows.
        assert model.effective_freq_mhz(workload, 1740, 300) < 1600, label
        assert 0.5 < workload.activity < 1.0, label


def test_fit_workload_recovers_a_known_workload():
    model = DVFSModel("A100-SXM")
    truth = Workload(compute_s_at_max=0.04, memory_s=0.015, activity=0.9)
    freqs = np.array(model.supported_sm_clocks_mhz())[::3]
    sweep = model.sweep(truth, freqs, 400.0)
    measurement = MeasuredSweep(freqs, sweep.time_s, sweep.energy_j)
    fitted = fit_workload(model, measurement)
    # The power cap moves in 15 MHz steps, so the fit is close rather than exact.
    assert fitted.compute_s_at_max == pytest.approx(truth.compute_s_at_max, rel=0.01)
    assert fitted.memory_s == pytest.approx(truth.memory_s, rel=0.01)
    assert fitted.activity == pytest.approx(truth.activity, rel=0.01)
    q = compare(model, fitted, measurement)
    assert q.time_rel_err_max < 0.01 and q.energy_rel_err_max < 0.01
    assert q.model_optimal_freq_mhz == q.measured_optimal_freq_mhz


def test_fit_power_curve_recovers_a_known_curve():
    shipped = get_gpu_spec("A40")
    truth = dataclasses.replace(shipped, static_power_w=90.0, voltage_floor=0.8, knee_mhz=1200.0)
    model = DVFSModel(truth)
    workloads = [Workload(0.05, 0.05, 0.8), Workload(0.1, 0.02, 0.7), Workload(0.03, 0.09, 0.9)]
    freqs = np.arange(1740, 854, -15)
    measurements = []
    for w in workloads:
        sweep = model.sweep(w, freqs, 300.0)
        measurements.append(MeasuredSweep(freqs, sweep.time_s, sweep.energy_j))
    fitted, fitted_workloads = fit_power_curve(shipped, measurements)
    fitted_model = DVFSModel(fitted)
    for w, m in zip(fitted_workloads, measurements, strict=True):
        q = compare(fitted_model, w, m)
        assert q.time_rel_err_max < 0.01 and q.energy_rel_err_max < 0.01
    assert fitted.static_power_w == pytest.approx(90.0, rel=0.05)
    assert fitted.voltage_floor == pytest.approx(0.8, rel=0.05)


def test_measured_sweep_validation():
    with pytest.raises(GPUValueError, match=">= 3 rows"):
        MeasuredSweep(np.array([1740, 1725]), np.array([1.0, 1.0]), np.array([1.0, 1.0]))
    with pytest.raises(GPUValueError, match="positive"):
        MeasuredSweep(np.array([3, 2, 1]), np.array([1.0, 0.0, 1.0]), np.array([1.0, 1.0, 1.0]))


@pytest.mark.parametrize(("name", "preset"), zip(FILES, ["gpt3", "bloom"], strict=True))
def test_the_emulators_kind_presets_are_the_fits_of_the_published_profiles(name, preset):
    """`KIND_PRESETS` (what the emulated hook's forwards and backwards run) are the fitted
    memory fraction and activity of stage 0 (stages 0-6 are identical layers, so their
    median), rounded to 3 decimals (`scripts/calibrate_emulator.py --kinds`)."""
    from perseus.client.settings import KIND_PRESETS

    model = DVFSModel("A40")
    for label, m in _measurements(name, (0,)):
        kind = label.rsplit(":", 1)[1]
        w = fit_workload(model, m)
        memory_fraction, activity = KIND_PRESETS[preset][kind]
        assert w.memory_fraction == pytest.approx(memory_fraction, abs=5e-4), label
        assert w.activity == pytest.approx(activity, abs=5e-4), label
