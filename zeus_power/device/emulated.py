"""An emulated GPU: the `GPU` interface on top of a `DVFSModel` (`zeus_power.device.dvfs`).

`EmulatedGPU` runs `Workload`s at its locked clock and power limit as the model says. The
energy it draws is the idle power over the elapsed time of an injectable clock, plus the
extra (above-idle) power of the work it executed or was told about, which may decay after the
work stops (`power_decay_s`) and drift slowly (`power_drift_per_hour`); its sensors show that
energy as a real GPU's do (`zeus_power.device.sensors`: a counter and power readings that
refresh every 100 ms, a 2.4 ms counter read, noise), or exactly with ``sensors="ideal"``.
`VirtualClock` lets tests run in virtual time without sleeping.

The model's pieces (`DVFSModel`, `Workload`, `Execution`, `Sweep`, `DEFAULT_ACTIVITY`) and
`VirtualClock` are importable from here too, where the emulator's users look for them.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

import numpy as np

from zeus_power.device.base import GPU, GPUNotSupportedError, GPUPermissionError, GPUValueError
from zeus_power.device.clock import VirtualClock
from zeus_power.device.dvfs import (
    DEFAULT_ACTIVITY,
    DVFSModel,
    Execution,
    Sweep,
    Workload,
    WorkloadLike,
    _check_finite,
)
from zeus_power.device.sensors import EnergyMeter, SensorSpec, sensor_spec
from zeus_power.device.specs import GPUSpec

__all__ = [
    "DEFAULT_ACTIVITY",
    "DVFSModel",
    "EmulatedGPU",
    "Execution",
    "MAX_POWER_DECAY_S",
    "MAX_POWER_DRIFT_PER_HOUR",
    "Sweep",
    "VirtualClock",
    "Workload",
]

MAX_POWER_DECAY_S = 1.0
"""Longest time constant `EmulatedGPU(power_decay_s=...)` takes."""
MAX_POWER_DRIFT_PER_HOUR = 0.5
"""Largest drift `EmulatedGPU(power_drift_per_hour=...)` takes, either way."""


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
        switch_latency_s: Seconds a new SM clock takes to come into force after
            `lock_sm_clocks`/`reset_sm_clocks` (0: at once). Until then the previous clock
            stays in force, for `execute` and for the hook's emulation alike.
        sensors: What the energy counter and power readings show: a `SensorSpec`,
            ``"real"`` (the default: 100 ms refresh, 2.4 ms per counter read, 1 % noise) or
            ``"ideal"`` (exact and continuous, for tests that need exact energy). A counter
            read sleeps the read latency on a real clock; on a `VirtualClock` it costs no
            virtual time.
        power_decay_s: Time constant τ of the power's fall after work stops (0, the
            default: it drops to idle at once; at most `MAX_POWER_DECAY_S`). From the end
            of a busy period until the next begins the GPU draws
            ``idle + (P_last − idle)·exp(−(t − t_end)/τ)``, P_last the mean power of the
            work that ended. The energy counter and power readings show it; `execute`'s
            result and `busy_power_w` do not (they are the work's own figures).
        power_drift_per_hour: Slow drift of busy power: the power above idle that this
            GPU draws (and its sensors show) is scaled by
            ``1 + power_drift_per_hour · (t − t_open)/3600``, t_open the clock when it was
            opened, kept within [idle power, the power limit in force] (never lifted
            above a power asked for that exceeds it). 0 (the default): none; at most
            `MAX_POWER_DRIFT_PER_HOUR` either way. `execute`'s result and `busy_power_w`
            stay the model's figures.
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
        switch_latency_s: float = 0.0,
        sensors: SensorSpec | str = "real",
        power_decay_s: float = 0.0,
        power_drift_per_hour: float = 0.0,
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
        self.switch_latency_s = _check_finite("switch_latency_s", switch_latency_s)
        if self.switch_latency_s < 0:
            raise GPUValueError(
                f"switch_latency_s must be >= 0, got {switch_latency_s!r}", gpu_index=index
            )
        self._switch_from_mhz: int | None = None
        """The locked clock before the last change (None: unlocked), in force until
        `_switch_at_s`."""
        self._switch_at_s = -math.inf
        self._power_limit_mw = round(self.spec.default_power_limit_w * 1000)
        self.power_decay_s = _check_finite("power_decay_s", power_decay_s)
        """Time constant of the power's fall after work stops (0: at once)."""
        if not 0.0 <= self.power_decay_s <= MAX_POWER_DECAY_S:
            raise GPUValueError(
                f"power_decay_s must be in [0, {MAX_POWER_DECAY_S:g}] s, got {power_decay_s!r}",
                gpu_index=index,
            )
        self.power_drift_per_hour = _check_finite(
            "power_drift_per_hour", power_drift_per_hour, minimum=-math.inf
        )
        """Relative change of busy power above idle per hour of this GPU's clock."""
        if abs(self.power_drift_per_hour) > MAX_POWER_DRIFT_PER_HOUR:
            raise GPUValueError(
                f"power_drift_per_hour must be in [-{MAX_POWER_DRIFT_PER_HOUR:g}, "
                f"{MAX_POWER_DRIFT_PER_HOUR:g}], got {power_drift_per_hour!r}",
                gpu_index=index,
            )
        self.sensors = sensor_spec(sensors)
        """What this GPU's energy counter and power readings show."""
        sensor_rng = np.random.default_rng(None if seed is None else [seed, index, 1])
        self._opened_s = clock()
        self._meter = EnergyMeter(
            self.spec.idle_power_w,
            self._opened_s,
            self.sensors,
            sensor_rng,
            decay_s=self.power_decay_s,
        )

    # -- emulator-only attributes -----------------------------------------------------------
    @property
    def idle_power_w(self) -> float:
        """Power with nothing running."""
        return self.spec.idle_power_w

    def drawn_energy_j(self, t_s: float | None = None) -> float:
        """The energy this GPU has drawn from its start to `t_s` (default: now), exactly:
        the truth behind its counter, with the power after work stops and the drift but no
        refresh, sampling or noise. For tests and benchmarks; no real GPU shows it."""
        with self._lock:
            return float(self._meter.exact_j(self._clock() if t_s is None else t_s))

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

    def drift_factor(self, t_s: float | None = None) -> float:
        """The factor on busy power above idle at time `t_s` (default: now), before the
        clip to [idle, power limit]: ``1 + power_drift_per_hour · (t − t_open)/3600``."""
        t = self._clock() if t_s is None else t_s
        return 1.0 + self.power_drift_per_hour * (t - self._opened_s) / 3600.0

    def _drawn_w(self, power_w: float, start_s: float, end_s: float) -> float:
        """The power this GPU draws for work at `power_w` over [start_s, end_s]: at least
        idle, and with a drift its part above idle scaled by the factor at the midpoint,
        within [idle, max(power limit, power_w)]. Call with the lock held."""
        idle = self.idle_power_w
        power_w = max(power_w, idle)
        if not self.power_drift_per_hour:
            return power_w
        factor = self.drift_factor(0.5 * (start_s + end_s))
        high = max(self._power_limit_mw / 1000.0, power_w)
        return min(max(idle + (power_w - idle) * factor, idle), high)

    def current_sm_clock_mhz(self) -> int:
        """The SM clock in force: the locked one, or the max clock when none is locked
        (ignores power capping). During a switch (`switch_latency_s`), the previous one."""
        return self._clock_at(self._clock())

    def _clock_at(self, t_s: float) -> int:
        locked = self._switch_from_mhz if t_s < self._switch_at_s else self._locked_clock_mhz
        return self.spec.max_sm_clock_mhz if locked is None else locked

    def switch_lag(self, ago_s: float = 0.0) -> tuple[int, float]:
        """(clock in force ``ago_s`` seconds ago, seconds from then until the newest clock
        asked for takes effect; 0 when it was already in force).

        Work that began ``ago_s`` seconds ago ran its first ``lag`` seconds at the first
        clock, the rest at `target_sm_clock_mhz`.
        """
        start_s = self._clock() - max(ago_s, 0.0)
        with self._lock:
            return self._clock_at(start_s), max(self._switch_at_s - start_s, 0.0)

    def target_sm_clock_mhz(self) -> int:
        """The newest clock asked for (in force once its switch completes)."""
        locked = self._locked_clock_mhz
        return self.spec.max_sm_clock_mhz if locked is None else locked

    def _switch_to(self, clock_mhz: int | None) -> None:
        """Ask for `clock_mhz` (None: unlocked); in force after `switch_latency_s`. Call
        with the lock held. Asking again for the clock already asked for changes nothing."""
        if clock_mhz == self._locked_clock_mhz:
            return
        now = self._clock()
        self._switch_from_mhz = (
            self._switch_from_mhz if now < self._switch_at_s else self._locked_clock_mhz
        )
        self._locked_clock_mhz = clock_mhz
        self._switch_at_s = now + self.switch_latency_s if self.switch_latency_s > 0 else -math.inf

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
            start_s = self._clock()
            result = self._run_switching(workload, start_s)
            if self._noise:
                time_s = result.time_s * self._noise_factor()
                power_w = result.power_w * self._noise_factor()
                result = Execution(time_s, power_w * time_s, result.freq_mhz, power_w)
            end_s = start_s + result.time_s
            self._meter.add(start_s, end_s, self._drawn_w(result.power_w, start_s, end_s))
        virtual = isinstance(self._clock, VirtualClock)
        if wait is None:
            wait = virtual or self._sleep
        if wait and isinstance(self._clock, VirtualClock):
            self._clock.advance(result.time_s)
        elif wait:
            time.sleep(result.time_s)
        return result

    def _run_switching(self, workload: WorkloadLike, start_s: float) -> Execution:
        """The model's run of `workload` from `start_s`: its first part at the clock in force
        until a pending switch completes, the rest at the new clock."""
        limit_w = self.power_limit_w()
        new = self.model.run(workload, self.target_sm_clock_mhz(), limit_w)
        lag_s = self._switch_at_s - start_s
        old_mhz = self._clock_at(start_s)
        if lag_s <= 0 or old_mhz == self.target_sm_clock_mhz():
            return new
        old = self.model.run(workload, old_mhz, limit_w)
        if old.time_s <= lag_s:  # done before the new clock arrives
            return old
        left = 1.0 - lag_s / old.time_s  # share of the work still to do at the new clock
        time_s = lag_s + left * new.time_s
        energy_j = old.power_w * lag_s + left * new.energy_j
        return Execution(time_s, energy_j, new.freq_mhz, energy_j / time_s)

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
    def emulated(self) -> bool:
        """Always True: this GPU's numbers are the DVFS model's."""
        return True

    @property
    def stand_in(self) -> EmulatedGPU:
        """Itself: it runs no kernels, so the caller's work stands in for them (see `StandIn`)."""
        return self

    def record_busy(self, duration_s: float, power_w: float) -> None:
        """Add `duration_s` of work at `power_w`, just finished, to the energy drawn.

        Only the part above idle power counts extra (idle power accrues with the clock);
        a power below idle adds nothing, so the counter never runs backwards. Work booked
        after the fact reaches a refreshing counter at its next refresh. With
        `power_decay_s` it cuts the tail of the work before it where it began (a counter
        that already showed that part of the tail takes it back from its next refreshes).
        """
        duration_s = _check_finite("duration_s", duration_s)
        power_w = _check_finite("power_w", power_w)
        with self._lock:
            now = self._clock()
            start = now - duration_s
            self._meter.add(start, now, self._drawn_w(power_w, start, now))

    def begin_busy(self, power_w: float) -> None:
        """Work at `power_w` starts now (until `end_busy`): the sensors see it as it runs."""
        power_w = _check_finite("power_w", power_w)
        with self._lock:
            now = self._clock()
            self._meter.open(now, self._drawn_w(power_w, now, now))

    def end_busy(self, duration_s: float, energy_j: float) -> None:
        """The work `begin_busy` started lasted `duration_s` from its start and drew
        `energy_j` in all (a clock switch inside it changes its power)."""
        duration_s = _check_finite("duration_s", duration_s)
        energy_j = _check_finite("energy_j", energy_j)
        with self._lock:
            meter = self._meter
            start = meter.open_start_s()
            if start is None:  # nothing open: book it as just finished
                now = self._clock()
                power_w = energy_j / max(duration_s, 1e-12)
                meter.add(now - duration_s, now, self._drawn_w(power_w, now - duration_s, now))
                return
            end = start + duration_s
            power_w = energy_j / duration_s if duration_s > 0 else self.idle_power_w
            meter.close(end, energy_j=self._drawn_w(power_w, start, end) * duration_s)

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
            self._switch_to(clock)

    def reset_sm_clocks(self) -> None:
        self._require_privilege("Resetting SM clocks")
        with self._lock:
            self._switch_to(None)

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
        """The energy counter as its sensor shows it (`sensors`): with real sensors the
        value of the last refresh, and the read takes `SensorSpec.read_latency_s`."""
        if not self._energy_counter:
            raise GPUNotSupportedError(
                "This GPU has no energy counter; poll power_usage_mw() instead",
                gpu_index=self.index,
            )
        with self._lock:
            value = int(self._meter.counter_j(self._clock()) * 1e3)
        latency = self.sensors.read_latency_s
        if latency > 0 and not isinstance(self._clock, VirtualClock):
            time.sleep(latency)
        return value

    def power_usage_mw(self) -> int:
        """Power as the sensor shows it: the last refresh's mean power (ideal sensors: the
        power of the work in progress now, else idle)."""
        with self._lock:
            return round(self._meter.power_reading_w(self._clock()) * 1000)

    def follow(self, locked_clock_mhz: int | None, power_limit_mw: int) -> None:
        """Take on the clock and power limit another process (a GPU daemon) set.

        Needs no privilege: it changes this process's copy of the model, not the GPU, as
        the job-side mirror of a daemon's emulated GPU (`zeus_power.device.zeusd`) does.
        """
        with self._lock:
            self._locked_clock_mhz = None if locked_clock_mhz is None else int(locked_clock_mhz)
            self._switch_at_s = -math.inf  # the daemon's GPU emulates its own switching
            self._power_limit_mw = int(power_limit_mw)

    def __repr__(self) -> str:
        return f"EmulatedGPU(index={self.index}, gpu_type={self.spec.gpu_type!r})"
