"""An emulated GPU driven by a DVFS (dynamic voltage and frequency scaling) model.

The model (equations and fitted parameters in `docs/emulator.md`):

    V(f)  = v_floor                                   for f <= f_knee
          = v_floor + (1 - v_floor)·((f - f_knee)/(f_max - f_knee))^γ   above the knee
    P(f)  = P_static + activity · P_dyn · V(f)² · f / f_max          busy power, W
    f_eff = the highest supported clock <= the locked clock with P(f_eff) <= power limit
    T     = compute_s_at_max · f_max / f_eff + memory_s                time, s
    E     = P(f_eff) · T                                               energy, J

Energy against frequency is U-shaped: above the knee, voltage (and so energy per cycle)
rises with f; below it, static power accrues over an ever longer run time.

`EmulatedGPU` implements the `GPU` interface on top of a `DVFSModel`. Its monotone energy
counter integrates the idle power over the elapsed time of an injectable clock, plus the
extra (above-idle) power of the work it executed or was told about. `VirtualClock` lets
tests run in virtual time without sleeping.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from zeus_power.device.base import GPU, GPUNotSupportedError, GPUPermissionError, GPUValueError
from zeus_power.device.specs import GPUSpec, get_gpu_spec

__all__ = [
    "DEFAULT_ACTIVITY",
    "DVFSModel",
    "EmulatedGPU",
    "Execution",
    "Sweep",
    "VirtualClock",
    "Workload",
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

    def voltage(self, freq_mhz: float) -> float:
        """Core voltage at `freq_mhz`, relative to the voltage at the max clock."""
        return float(self._voltage(np.asarray(float(freq_mhz))))

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


class VirtualClock:
    """A clock that moves only when told to: pass it as `EmulatedGPU(clock=...)`.

    Calling it returns the current virtual time in seconds. `advance` (alias `sleep`) moves
    it forward; `EmulatedGPU.execute` advances it by the model time of the work.
    """

    def __init__(self, start_s: float = 0.0) -> None:
        if not math.isfinite(start_s):
            raise ValueError(f"start_s={start_s!r} must be finite")
        self._now_s = float(start_s)
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return self._now_s

    @property
    def now_s(self) -> float:
        """Current virtual time in seconds."""
        return self._now_s

    def advance(self, seconds: float) -> float:
        """Move forward by `seconds` (>= 0) and return the new time."""
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"A VirtualClock only moves forward; got seconds={seconds!r}")
        with self._lock:
            self._now_s += float(seconds)
            return self._now_s

    sleep = advance

    def __repr__(self) -> str:
        return f"VirtualClock(now_s={self._now_s!r})"


class EmulatedGPU(GPU):
    """A GPU that behaves like `gpu_type` according to its `DVFSModel`.

    Args:
        index: The GPU index it answers to.
        gpu_type: A name from `zeus_power.device.specs.GPU_SPECS` (e.g. "A40") or a `GPUSpec`.
        clock: Time source in seconds; a `VirtualClock` makes `execute` advance it instead of
            sleeping.
        seed: Seed of the measurement noise.
        noise: Relative standard deviation of the multiplicative (log-normal) noise applied
            to time and power by `execute`; 0 (default) is deterministic.
        sleep: Whether `execute` sleeps the model time when the clock is not a `VirtualClock`.
        privileged: When False, clock locking and power-limit setting raise
            `GPUPermissionError`, as on a real GPU without root or SYS_ADMIN.
        energy_counter: Override the spec's energy-counter support (False emulates a
            pre-Volta GPU: `total_energy_mj` raises `GPUNotSupportedError`).
    """

    def __init__(
        self,
        index: int = 0,
        *,
        gpu_type: str | GPUSpec = "A100-SXM",
        clock: Callable[[], float] = time.monotonic,
        seed: int | None = None,
        noise: float = 0.0,
        sleep: bool = True,
        privileged: bool = True,
        energy_counter: bool | None = None,
    ) -> None:
        super().__init__(index)
        self.model = DVFSModel(gpu_type)
        self.spec = self.model.spec
        self._clock = clock
        self._noise = _check_finite("noise", noise)
        self._rng = np.random.default_rng(None if seed is None else [seed, index])
        self._sleep = sleep
        self._privileged = privileged
        self._energy_counter = (
            self.spec.energy_counter if energy_counter is None else energy_counter
        )
        self._lock = threading.Lock()
        self._locked_clock_mhz: int | None = None
        self._power_limit_mw = round(self.spec.default_power_limit_w * 1000)
        self._origin_s = clock()
        self._extra_energy_mj = 0.0
        self._busy_until_s = -math.inf
        self._busy_power_w = self.spec.idle_power_w

    # -- emulator-only attributes -----------------------------------------------------------
    @property
    def gpu_type(self) -> str:
        """Registry name of the emulated type."""
        return self.spec.gpu_type

    @property
    def idle_power_w(self) -> float:
        """Power with nothing running."""
        return self.spec.idle_power_w

    @property
    def p2p_block_power_w(self) -> float:
        """Power while blocked on peer-to-peer communication."""
        return self.spec.p2p_block_power_w

    @property
    def max_power_w(self) -> float:
        """Highest settable power limit (TDP)."""
        return self.spec.max_power_w

    @property
    def clock(self) -> Callable[[], float]:
        """The time source this GPU reads."""
        return self._clock

    def current_sm_clock_mhz(self) -> int:
        """The locked SM clock, or the max clock when none is locked (ignores power capping)."""
        locked = self._locked_clock_mhz
        return self.spec.max_sm_clock_mhz if locked is None else locked

    def power_limit_w(self) -> float:
        """The power limit in force, in W."""
        return self._power_limit_mw / 1000.0

    # -- running work -----------------------------------------------------------------------
    def _noise_factor(self) -> float:
        if self._noise == 0.0:
            return 1.0
        return float(np.exp(self._rng.normal(0.0, self._noise)))

    def execute(self, workload: WorkloadLike, *, wait: bool | None = None) -> Execution:
        """Run `workload` at the current locked clock and power limit.

        The energy counter gains the execution's energy. With a `VirtualClock` the clock
        advances by the run time; with a real clock the call sleeps it if the constructor's
        `sleep` is True. `wait=False` does neither (the caller moves time), `wait=True`
        forces it. GPUs sharing one `VirtualClock` thus run one after another by default;
        to run them side by side, `execute(..., wait=False)` each and advance the clock
        by the longest time.
        """
        with self._lock:
            result = self.model.run(workload, self.current_sm_clock_mhz(), self.power_limit_w())
            if self._noise:
                time_s = result.time_s * self._noise_factor()
                power_w = result.power_w * self._noise_factor()
                result = Execution(time_s, power_w * time_s, result.freq_mhz, power_w)
            start_s = self._clock()
            self._extra_energy_mj += (
                max(result.power_w - self.idle_power_w, 0.0) * result.time_s * 1e3
            )
            self._busy_until_s = start_s + result.time_s
            self._busy_power_w = result.power_w
        virtual = isinstance(self._clock, VirtualClock)
        if wait is None:
            wait = virtual or self._sleep
        if wait and isinstance(self._clock, VirtualClock):
            self._clock.advance(result.time_s)
        elif wait:
            time.sleep(result.time_s)
        return result

    def stretch_factor(self, workload: WorkloadLike, freq_mhz: float | None = None) -> float:
        """Model time at `freq_mhz` (default: current clock) over time at the max clock.

        Both under the current power limit. A process doing real work in place of a GPU
        instruction stretches its run time by this factor to emulate the locked clock.
        """
        freq = self.current_sm_clock_mhz() if freq_mhz is None else freq_mhz
        return self.model.stretch_factor(workload, freq, self.power_limit_w())

    def busy_power_w(self, workload: WorkloadLike, freq_mhz: float | None = None) -> float:
        """Power while running `workload` at `freq_mhz` (default: current clock), power-capped."""
        freq = self.current_sm_clock_mhz() if freq_mhz is None else freq_mhz
        return self.model.run(workload, freq, self.power_limit_w()).power_w

    @property
    def stand_in(self) -> EmulatedGPU:
        """Itself: it runs no kernels, so the caller's work stands in for them (see `StandIn`)."""
        return self

    def record_busy(self, duration_s: float, power_w: float) -> None:
        """Add `duration_s` of work at `power_w`, just finished, to the energy counter.

        Only the part above idle power counts extra (idle power accrues with the clock);
        a power below idle adds nothing, so the counter never runs backwards.
        """
        duration_s = _check_finite("duration_s", duration_s)
        power_w = _check_finite("power_w", power_w)
        with self._lock:
            self._extra_energy_mj += max(power_w - self.idle_power_w, 0.0) * duration_s * 1e3
            self._busy_until_s = self._clock()
            self._busy_power_w = power_w

    # -- GPU interface ----------------------------------------------------------------------
    def name(self) -> str:
        return f"{self.spec.product_name} (emulated)"

    def supported_memory_clocks_mhz(self) -> list[int]:
        return list(self.spec.memory_clocks_mhz)

    def supported_sm_clocks_mhz(self, memory_clock_mhz: int | None = None) -> list[int]:
        if memory_clock_mhz is not None and memory_clock_mhz not in self.spec.memory_clocks_mhz:
            raise GPUValueError(
                f"Memory clock {memory_clock_mhz} MHz is not supported; supported: "
                f"{list(self.spec.memory_clocks_mhz)}",
                gpu_index=self.index,
            )
        return self.model.supported_sm_clocks_mhz()

    def _require_privilege(self, what: str) -> None:
        if not self._privileged:
            raise GPUPermissionError(
                f"{what} needs root (run with sudo) or the SYS_ADMIN capability "
                "(docker run --cap-add SYS_ADMIN)",
                gpu_index=self.index,
            )

    def lock_sm_clocks(self, min_mhz: int, max_mhz: int) -> None:
        self._require_privilege("Locking SM clocks")
        s = self.spec
        if min_mhz > max_mhz:
            raise GPUValueError(
                f"lock_sm_clocks({min_mhz}, {max_mhz}): min_mhz exceeds max_mhz",
                gpu_index=self.index,
            )
        if min_mhz < s.min_sm_clock_mhz or max_mhz > s.max_sm_clock_mhz:
            raise GPUValueError(
                f"lock_sm_clocks({min_mhz}, {max_mhz}) is outside the supported range "
                f"{s.min_sm_clock_mhz}..{s.max_sm_clock_mhz} MHz",
                gpu_index=self.index,
            )
        clock = self.model.floor_clock_mhz(max_mhz)
        if clock < min_mhz:
            raise GPUValueError(
                f"No supported SM clock lies in [{min_mhz}, {max_mhz}] MHz "
                f"(clocks are {s.sm_clock_step_mhz} MHz apart from {s.max_sm_clock_mhz})",
                gpu_index=self.index,
            )
        with self._lock:
            self._locked_clock_mhz = clock

    def reset_sm_clocks(self) -> None:
        self._require_privilege("Resetting SM clocks")
        with self._lock:
            self._locked_clock_mhz = None

    def power_limit_constraints_mw(self) -> tuple[int, int]:
        return (
            round(self.spec.min_power_limit_w * 1000),
            round(self.spec.max_power_limit_w * 1000),
        )

    def default_power_limit_mw(self) -> int:
        return round(self.spec.default_power_limit_w * 1000)

    def get_power_limit_mw(self) -> int:
        return self._power_limit_mw

    def set_power_limit_mw(self, limit_mw: int) -> None:
        self._require_privilege("Setting the power limit")
        low, high = self.power_limit_constraints_mw()
        if not low <= limit_mw <= high:
            raise GPUValueError(
                f"Power limit {limit_mw} mW is outside the supported range {low}..{high} mW",
                gpu_index=self.index,
            )
        with self._lock:
            self._power_limit_mw = int(limit_mw)

    def supports_energy_counter(self) -> bool:
        return self._energy_counter

    def total_energy_mj(self) -> int:
        if not self._energy_counter:
            raise GPUNotSupportedError(
                "This GPU has no energy counter; poll power_usage_mw() instead",
                gpu_index=self.index,
            )
        with self._lock:
            elapsed_s = max(self._clock() - self._origin_s, 0.0)
            return int(self.idle_power_w * elapsed_s * 1e3 + self._extra_energy_mj)

    def power_usage_mw(self) -> int:
        """Power of the work in progress or just finished (at this clock reading), else idle."""
        with self._lock:
            busy = self._clock() <= self._busy_until_s
            return round((self._busy_power_w if busy else self.idle_power_w) * 1000)

    def __repr__(self) -> str:
        return f"EmulatedGPU(index={self.index}, gpu_type={self.spec.gpu_type!r})"
