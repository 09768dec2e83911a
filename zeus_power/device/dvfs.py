"""The DVFS (dynamic voltage and frequency scaling) model behind the emulated GPU.

The model (equations and fitted parameters in `docs/emulator.md`):

    V(f)  = v_floor                                   for f <= f_knee
          = v_floor + (1 - v_floor)·((f - f_knee)/(f_max - f_knee))^γ   above the knee
    P(f)  = P_static + activity · P_dyn · V(f)² · f / f_max          busy power, W
    f_eff = the highest supported clock <= the locked clock with P(f_eff) <= power limit
    T     = compute_s_at_max · f_max / f_eff + memory_s                time, s
    E     = P(f_eff) · T                                               energy, J

Energy against frequency is U-shaped: above the knee, voltage (and so energy per cycle)
rises with f; below it, static power accrues over an ever longer run time.

`Workload` is one GPU instruction; `DVFSModel` gives its time, power and energy at a clock
and power limit (`run` -> `Execution`, `sweep` -> `Sweep` over many clocks). Profile
synthesis, calibration and `zeus_power.device.emulated.EmulatedGPU` all use it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from zeus_power.device.base import GPUValueError
from zeus_power.device.specs import GPUSpec, get_gpu_spec

__all__ = [
    "DEFAULT_ACTIVITY",
    "DVFSModel",
    "Execution",
    "Sweep",
    "Workload",
    "WorkloadLike",
    "as_workload",
]

DEFAULT_ACTIVITY = 0.8
"""Activity of a typical large-model training instruction (A40 fits give 0.75 to 0.83)."""


def _check_finite(name: str, value: float, *, minimum: float = 0.0, strict: bool = False) -> float:
    value = float(value)
    bad = not math.isfinite(value) or value < minimum or (strict and value == minimum)
    if bad:
        bound = f"> {minimum}" if strict else f">= {minimum}"
        raise GPUValueError(f"{name}={value!r} must be a finite number {bound}")
    return value


@dataclass(frozen=True)
class Workload:
    """One GPU instruction (e.g. the forward of one microbatch on one pipeline stage).

    `compute_s_at_max` is the compute-bound time at the max SM clock (it scales as 1/f);
    `memory_s` is the frequency-insensitive (memory-bound) time; `activity` scales the
    dynamic power (0.8 is typical of transformer training; 1.0 draws `dynamic_power_w`).
    """

    compute_s_at_max: float
    memory_s: float = 0.0
    activity: float = DEFAULT_ACTIVITY

    def __post_init__(self) -> None:
        _check_finite("compute_s_at_max", self.compute_s_at_max)
        _check_finite("memory_s", self.memory_s)
        _check_finite("activity", self.activity, strict=True)
        if self.compute_s_at_max + self.memory_s <= 0:
            raise GPUValueError(
                "A workload needs positive time: compute_s_at_max + memory_s is 0; "
                "give at least one of them a positive value"
            )

    @classmethod
    def from_memory_fraction(
        cls,
        memory_fraction: float,
        *,
        time_s_at_max: float = 1.0,
        activity: float = DEFAULT_ACTIVITY,
    ) -> Workload:
        """A workload taking `time_s_at_max` at the max clock, `memory_fraction` of it memory-bound."""
        if not 0.0 <= float(memory_fraction) <= 1.0:
            raise GPUValueError(f"memory_fraction={memory_fraction!r} must be in [0, 1]")
        _check_finite("time_s_at_max", time_s_at_max, strict=True)
        return cls(
            compute_s_at_max=time_s_at_max * (1.0 - memory_fraction),
            memory_s=time_s_at_max * memory_fraction,
            activity=activity,
        )

    @property
    def time_s_at_max(self) -> float:
        """Run time at the max SM clock with no power cap."""
        return self.compute_s_at_max + self.memory_s

    @property
    def memory_fraction(self) -> float:
        """Share of the run time at the max clock that does not scale with frequency."""
        return self.memory_s / self.time_s_at_max

    def scaled(self, factor: float) -> Workload:
        """The same kind of work, `factor` times as much (activity unchanged)."""
        _check_finite("factor", factor, strict=True)
        return Workload(self.compute_s_at_max * factor, self.memory_s * factor, self.activity)


WorkloadLike = Workload | float
"""A `Workload`, or a memory fraction in [0, 1] standing for a unit workload of that split."""


def as_workload(workload: WorkloadLike) -> Workload:
    """Accept a `Workload` or a memory fraction (see `WorkloadLike`)."""
    if isinstance(workload, Workload):
        return workload
    if isinstance(workload, bool) or not isinstance(workload, (int, float)):
        raise GPUValueError(
            f"Expected a Workload or a memory fraction in [0, 1], got {type(workload).__name__}"
        )
    return Workload.from_memory_fraction(float(workload))


@dataclass(frozen=True)
class Sweep:
    """`DVFSModel.sweep`: one entry per requested clock (arrays of equal length)."""

    freq_mhz: np.ndarray
    effective_freq_mhz: np.ndarray
    time_s: np.ndarray
    power_w: np.ndarray
    energy_j: np.ndarray


@dataclass(frozen=True)
class Execution:
    """The outcome of running one workload: time, energy, the clock it ran at, its power."""

    time_s: float
    energy_j: float
    freq_mhz: int
    power_w: float


class DVFSModel:
    """Time and power of a workload against SM frequency for one GPU type.

    Profile synthesis, `EmulatedGPU` and the emulated per-rank hook all use this class, so
    they agree on the numbers. Methods taking `freq_mhz` accept any clock within the
    supported range and round it down to a supported one; `None` means the max clock.
    """

    def __init__(self, spec: GPUSpec | str) -> None:
        self.spec = get_gpu_spec(spec) if isinstance(spec, str) else spec
        self._clocks = np.array(self.spec.supported_sm_clocks_mhz(), dtype=np.int64)
        self._shape = self._dynamic_shape(self._clocks.astype(float))

    # -- the curve --------------------------------------------------------------------------
    def supported_sm_clocks_mhz(self) -> list[int]:
        """Supported SM clocks, descending."""
        return [int(f) for f in self._clocks]

    def _voltage(self, freq_mhz: np.ndarray) -> np.ndarray:
        s = self.spec
        rise = np.clip((freq_mhz - s.knee_mhz) / (s.max_sm_clock_mhz - s.knee_mhz), 0.0, None)
        return s.voltage_floor + (1.0 - s.voltage_floor) * rise**s.voltage_exponent

    def _dynamic_shape(self, freq_mhz: np.ndarray) -> np.ndarray:
        """V(f)²·f/f_max: dynamic power relative to the max clock."""
        return self._voltage(freq_mhz) ** 2 * freq_mhz / self.spec.max_sm_clock_mhz

    def _clock_index(self, freq_mhz: float | None) -> int:
        """Index (into the descending clocks) of the highest supported clock <= freq_mhz."""
        if freq_mhz is None:
            return 0
        return int(self._clock_indices(np.array([float(freq_mhz)]))[0])

    def floor_clock_mhz(self, freq_mhz: float) -> int:
        """The highest supported clock at or below `freq_mhz` (which must be in range)."""
        return int(self._clocks[self._clock_index(freq_mhz)])

    def power_w(self, workload: WorkloadLike, freq_mhz: float | None = None) -> float:
        """Busy power at exactly `freq_mhz` (rounded down to a supported clock), no power cap."""
        w = as_workload(workload)
        shape = float(self._shape[self._clock_index(freq_mhz)])
        return self.spec.static_power_w + w.activity * self.spec.dynamic_power_w * shape

    def _clock_indices(self, freq_mhz: np.ndarray) -> np.ndarray:
        s = self.spec
        bad = (freq_mhz < s.min_sm_clock_mhz) | (freq_mhz > s.max_sm_clock_mhz)
        if bad.any():
            raise GPUValueError(
                f"SM clock {freq_mhz[bad][0]} MHz is outside the {s.gpu_type}'s supported range "
                f"{s.min_sm_clock_mhz}..{s.max_sm_clock_mhz} MHz"
            )
        steps = np.ceil((s.max_sm_clock_mhz - freq_mhz) / s.sm_clock_step_mhz - 1e-9)
        return steps.astype(np.int64)

    def _cap_index(self, activity: float, power_limit_w: float | None) -> int:
        """Index of the highest clock whose busy power fits the limit (the last if none)."""
        if power_limit_w is None:
            return 0
        powers = self.spec.static_power_w + activity * self.spec.dynamic_power_w * self._shape
        within = np.nonzero(powers <= power_limit_w)[0]
        return int(within[0]) if within.size else len(self._clocks) - 1

    def sweep(
        self,
        workload: WorkloadLike,
        freqs_mhz: np.ndarray | list[int] | None = None,
        power_limit_w: float | None = None,
    ) -> Sweep:
        """`run` over many locked clocks at once (default: every supported clock, descending)."""
        w = as_workload(workload)
        if freqs_mhz is None:
            freqs = self._clocks.astype(float)
        else:
            freqs = np.atleast_1d(np.asarray(freqs_mhz, dtype=float))
        index = np.maximum(self._clock_indices(freqs), self._cap_index(w.activity, power_limit_w))
        f_eff = self._clocks[index]
        time_s = w.compute_s_at_max * self.spec.max_sm_clock_mhz / f_eff + w.memory_s
        power_w = (
            self.spec.static_power_w + w.activity * self.spec.dynamic_power_w * self._shape[index]
        )
        return Sweep(
            freq_mhz=freqs,
            effective_freq_mhz=f_eff,
            time_s=time_s,
            power_w=power_w,
            energy_j=power_w * time_s,
        )

    def effective_freq_mhz(
        self,
        workload: WorkloadLike,
        freq_mhz: float | None = None,
        power_limit_w: float | None = None,
    ) -> int:
        """The clock the GPU actually runs `workload` at, given a locked clock and power limit.

        The highest supported clock at or below `freq_mhz` whose busy power is within the
        limit; the min clock if even that one exceeds it.
        """
        return self.run(workload, freq_mhz, power_limit_w).freq_mhz

    def run(
        self,
        workload: WorkloadLike,
        freq_mhz: float | None = None,
        power_limit_w: float | None = None,
    ) -> Execution:
        """Time, energy, effective clock and power of `workload`."""
        freq = self.spec.max_sm_clock_mhz if freq_mhz is None else freq_mhz
        sweep = self.sweep(workload, [freq], power_limit_w)
        return Execution(
            time_s=float(sweep.time_s[0]),
            energy_j=float(sweep.energy_j[0]),
            freq_mhz=int(sweep.effective_freq_mhz[0]),
            power_w=float(sweep.power_w[0]),
        )

    def time_s(
        self,
        workload: WorkloadLike,
        freq_mhz: float | None = None,
        power_limit_w: float | None = None,
    ) -> float:
        """Run time in seconds."""
        return self.run(workload, freq_mhz, power_limit_w).time_s

    def energy_j(
        self,
        workload: WorkloadLike,
        freq_mhz: float | None = None,
        power_limit_w: float | None = None,
    ) -> float:
        """Energy in joules (busy power times run time, static power included)."""
        return self.run(workload, freq_mhz, power_limit_w).energy_j

    def stretch_factor(
        self,
        workload: WorkloadLike,
        freq_mhz: float | None = None,
        power_limit_w: float | None = None,
    ) -> float:
        """Run time at `freq_mhz` over run time at the max clock, under the same power limit."""
        w = as_workload(workload)
        return self.time_s(w, freq_mhz, power_limit_w) / self.time_s(w, None, power_limit_w)

    def energy_optimal_freq_mhz(
        self, workload: WorkloadLike, power_limit_w: float | None = None
    ) -> int:
        """The supported clock with the least energy for `workload` (ties: the faster one)."""
        sweep = self.sweep(workload, None, power_limit_w)
        return int(self._clocks[int(np.argmin(sweep.energy_j))])
