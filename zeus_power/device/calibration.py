"""Fit the emulator's DVFS model to measured instruction profiles.

Two fits, both robust least squares on log time and log energy (so a few noisy rows do
not drag the curve):

- `fit_workload`: with a GPU type's curve fixed, the `Workload` (compute/memory split and
  activity) that best reproduces one instruction's measured (frequency, time, energy)
  rows. Useful on its own to emulate a real model's instructions.
- `fit_power_curve`: the GPU type's curve (static power, voltage floor, knee, voltage
  exponent) jointly with every instruction's workload.

`compare` scores a workload against measurements: relative errors and where the
energy-optimal clock lands. `scripts/calibrate_emulator.py` runs both fits on the A40
reference profiles; `docs/emulator.md` records the result.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from zeus_power.device.base import GPUValueError
from zeus_power.device.dvfs import DVFSModel, Workload
from zeus_power.device.specs import GPUSpec

__all__ = ["FitQuality", "MeasuredSweep", "compare", "fit_power_curve", "fit_workload"]

_LOSS_SCALE = 0.02
"""Residuals (log ratio) beyond ~2 % count linearly, not quadratically (soft-L1 loss)."""


@dataclass(frozen=True)
class MeasuredSweep:
    """Measured rows of one instruction over SM clocks: equal-length arrays, any clock order.

    The measured counterpart of the model's `Sweep` (same field names), which the fits
    compare it with. Not `zeus_power.monitor.MeasuredSweep`, one window of a `ZeusMonitor`.
    """

    freq_mhz: np.ndarray
    time_s: np.ndarray
    energy_j: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.freq_mhz)
        if n < 3 or len(self.time_s) != n or len(self.energy_j) != n:
            raise GPUValueError(
                "A measured sweep needs >= 3 rows and equal-length frequency/time/energy arrays, "
                f"got {len(self.freq_mhz)}/{len(self.time_s)}/{len(self.energy_j)}"
            )
        if not (np.all(np.asarray(self.time_s) > 0) and np.all(np.asarray(self.energy_j) > 0)):
            raise GPUValueError("Measured times and energies must be positive")


@dataclass(frozen=True)
class FitQuality:
    """How well a model reproduces a measurement (relative errors as fractions)."""

    time_rel_err_median: float
    time_rel_err_max: float
    energy_rel_err_median: float
    energy_rel_err_max: float
    measured_optimal_freq_mhz: int
    """Clock of the least measured energy."""
    model_optimal_freq_mhz: int
    """Clock of the least model energy, among the measured clocks."""
    optimum_regret: float
    """Measured energy at the model's optimum over the measured minimum, minus 1."""


def _residuals(model: DVFSModel, workload: Workload, m: MeasuredSweep, limit_w: float | None):
    sweep = model.sweep(workload, m.freq_mhz, limit_w)
    return np.concatenate([np.log(sweep.time_s / m.time_s), np.log(sweep.energy_j / m.energy_j)])


def _initial_split(model: DVFSModel, m: MeasuredSweep) -> tuple[float, float]:
    """Least-squares compute/memory split on the lower half of the clocks (below any cap)."""
    freqs = np.asarray(m.freq_mhz, dtype=float)
    low = freqs <= np.median(freqs)
    design = np.c_[model.spec.max_sm_clock_mhz / freqs[low], np.ones(int(low.sum()))]
    (compute, memory), *_ = np.linalg.lstsq(design, np.asarray(m.time_s)[low], rcond=None)
    total = float(np.min(m.time_s))
    compute = float(np.clip(compute, 0.05 * total, total))
    return compute, float(np.clip(memory, 0.0, total))


def fit_workload(
    model: DVFSModel, measurement: MeasuredSweep, *, power_limit_w: float | None = None
) -> Workload:
    """The workload whose model time and energy best match `measurement` on `model`'s curve.

    `power_limit_w` is the limit the measurement ran under (default: the spec's default).
    """
    limit_w = model.spec.default_power_limit_w if power_limit_w is None else power_limit_w
    compute0, memory0 = _initial_split(model, measurement)
    power0 = float(np.median(measurement.energy_j / measurement.time_s))
    shape = (power0 - model.spec.static_power_w) / model.spec.dynamic_power_w
    activity0 = float(np.clip(shape / 0.6, 0.05, 2.0))

    def residuals(x: np.ndarray) -> np.ndarray:
        workload = Workload(float(x[0]), float(x[1]), float(x[2]))
        return _residuals(model, workload, measurement, limit_w)

    result = least_squares(
        residuals,
        x0=[compute0, memory0, activity0],
        bounds=([1e-9, 0.0, 1e-3], [np.inf, np.inf, 3.0]),
        loss="soft_l1",
        f_scale=_LOSS_SCALE,
        x_scale=[compute0, max(compute0, memory0), 0.1],
    )
    return Workload(float(result.x[0]), float(result.x[1]), float(result.x[2]))


_CURVE_FIELDS = ("static_power_w", "voltage_floor", "knee_mhz", "voltage_exponent")


def fit_power_curve(
    spec: GPUSpec,
    measurements: list[MeasuredSweep],
    *,
    power_limit_w: float | None = None,
) -> tuple[GPUSpec, list[Workload]]:
    """Fit `spec`'s curve (static power, voltage floor, knee, exponent) and every workload.

    `spec.dynamic_power_w` stays fixed: it only sets the scale of the activities.
    Returns the fitted spec and one workload per measurement, in order.
    """
    if not measurements:
        raise GPUValueError("fit_power_curve needs at least one measurement")
    limit_w = spec.default_power_limit_w if power_limit_w is None else power_limit_w
    base = DVFSModel(spec)
    starts = [fit_workload(base, m, power_limit_w=limit_w) for m in measurements]
    x0 = [getattr(spec, name) for name in _CURVE_FIELDS]
    for w in starts:
        x0 += [w.compute_s_at_max, w.memory_s, w.activity]
    curve_lo = [1.0, 0.3, spec.min_sm_clock_mhz, 0.3]
    curve_hi = [
        spec.max_power_limit_w,
        1.0,
        spec.max_sm_clock_mhz - 2 * spec.sm_clock_step_mhz,
        3.0,
    ]
    lower = curve_lo + [1e-9, 0.0, 1e-3] * len(measurements)
    upper = curve_hi + [np.inf, np.inf, 3.0] * len(measurements)
    x0 = list(np.clip(x0, lower, upper))
    scale = [20.0, 0.05, 50.0, 0.2]
    for w in starts:
        scale += [w.compute_s_at_max, max(w.compute_s_at_max, w.memory_s), 0.1]

    def unpack(x: np.ndarray) -> tuple[GPUSpec, list[Workload]]:
        fitted = dataclasses.replace(
            spec, **dict(zip(_CURVE_FIELDS, map(float, x[:4]), strict=True))
        )
        rest = x[4:].reshape(-1, 3)
        return fitted, [Workload(float(c), float(m), float(a)) for c, m, a in rest]

    def residuals(x: np.ndarray) -> np.ndarray:
        fitted, workloads = unpack(x)
        model = DVFSModel(fitted)
        return np.concatenate(
            [_residuals(model, w, m, limit_w) for w, m in zip(workloads, measurements, strict=True)]
        )

    result = least_squares(
        residuals,
        x0=x0,
        bounds=(lower, upper),
        loss="soft_l1",
        f_scale=_LOSS_SCALE,
        x_scale=scale,
    )
    return unpack(result.x)


def compare(
    model: DVFSModel,
    workload: Workload,
    measurement: MeasuredSweep,
    *,
    power_limit_w: float | None = None,
) -> FitQuality:
    """Score `workload` on `model` against `measurement`."""
    limit_w = model.spec.default_power_limit_w if power_limit_w is None else power_limit_w
    sweep = model.sweep(workload, measurement.freq_mhz, limit_w)
    time_err = np.abs(sweep.time_s / measurement.time_s - 1)
    energy_err = np.abs(sweep.energy_j / measurement.energy_j - 1)
    measured_best = int(np.argmin(measurement.energy_j))
    model_best = int(np.argmin(sweep.energy_j))
    return FitQuality(
        time_rel_err_median=float(np.median(time_err)),
        time_rel_err_max=float(time_err.max()),
        energy_rel_err_median=float(np.median(energy_err)),
        energy_rel_err_max=float(energy_err.max()),
        measured_optimal_freq_mhz=int(measurement.freq_mhz[measured_best]),
        model_optimal_freq_mhz=int(measurement.freq_mhz[model_best]),
        optimum_regret=float(
            measurement.energy_j[model_best] / measurement.energy_j[measured_best] - 1
        ),
    )
