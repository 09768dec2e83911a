"""What an emulated GPU's sensors show: an energy counter and power readings that refresh.

A real GPU does not show its energy as it is drawn. On the H100 we measured
(``docs/measurements/h100-2026-11-24``) the energy counter (`nvmlDeviceGetTotalEnergyConsumption`),
`nvmlDeviceGetPowerUsage` and the instant power field all refresh every **100 ms**, and one
counter read takes **2.4 ms**. On A100 and H100 the power sensor samples only about **25 %**
of each refresh period ("Part-time Power Measurements: nvidia-smi's Lack of Attention",
SC'24, arXiv 2312.02741). `SensorSpec` describes such a sensor and `EnergyMeter` computes
what it shows from the exact power history the emulator knows:

- every ``period_s`` (from a phase drawn per GPU) the counter steps up by the energy of the
  period just ended, or, with ``window < 1``, by the mean power over the period's last
  ``window · period_s`` seconds times the period (the rest of the period is not seen);
- each step is multiplied by ``1 + noise · N(0, 1)`` (never below 0: the counter is
  monotone);
- a power reading is the last step over the period; a counter read costs
  ``read_latency_s`` (`EmulatedGPU.total_energy_mj` sleeps it on a real clock).

``IDEAL_SENSORS`` (period 0) is the exact, continuous counter the emulator used to show: for
tests that need exact per-instruction energy, opt-in and named as such. Temperature is not
modelled: see ``docs/emulator.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from zeus_power.device.base import GPUValueError

__all__ = [
    "EnergyMeter",
    "IDEAL_SENSORS",
    "REAL_SENSORS",
    "SENSOR_MODES",
    "SensorSpec",
    "sensor_spec",
]

MAX_PERIOD_S = 10.0
_MAX_SEGMENTS = 4096
_FOLD_HORIZON_S = 2 * MAX_PERIOD_S
MAX_READ_LATENCY_S = 1.0


@dataclass(frozen=True, kw_only=True)
class SensorSpec:
    """How an emulated GPU's energy counter and power readings behave (validated on build)."""

    period_s: float = 0.1
    """Refresh period of the counter and the power readings (0: continuous, exact)."""
    window: float = 1.0
    """Share of each period the sensor samples: its last ``window · period_s`` seconds
    (1.0: all of it; 0.25: the A100/H100 figure of arXiv 2312.02741)."""
    read_latency_s: float = 0.0024
    """How long one energy-counter read takes (2.4 ms measured on an H100)."""
    noise: float = 0.01
    """Relative standard deviation of each refresh's energy step."""

    def __post_init__(self) -> None:
        problems = []
        if not (math.isfinite(self.period_s) and 0.0 <= self.period_s <= MAX_PERIOD_S):
            problems.append(f"period_s={self.period_s!r} must be in [0, {MAX_PERIOD_S}] s")
        if not (math.isfinite(self.window) and 0.0 < self.window <= 1.0):
            problems.append(f"window={self.window!r} must be in (0, 1]")
        if not (
            math.isfinite(self.read_latency_s) and 0.0 <= self.read_latency_s <= MAX_READ_LATENCY_S
        ):
            problems.append(
                f"read_latency_s={self.read_latency_s!r} must be in [0, {MAX_READ_LATENCY_S}] s"
            )
        if not (math.isfinite(self.noise) and 0.0 <= self.noise <= 1.0):
            problems.append(f"noise={self.noise!r} must be in [0, 1]")
        if problems:
            raise GPUValueError("Invalid sensor spec: " + "; ".join(problems))

    @property
    def ideal(self) -> bool:
        """Whether the counter is exact and continuous (no refresh period, noise or latency)."""
        return self.period_s == 0.0 and self.noise == 0.0 and self.read_latency_s == 0.0

    def describe(self) -> str:
        """One line for logs: ``ideal`` or the period, window, latency and noise."""
        if self.ideal:
            return "ideal (exact, continuous)"
        window = "" if self.window == 1.0 else f", {self.window:.0%} of each period sampled"
        return (
            f"refresh {self.period_s * 1000:g} ms{window}, read {self.read_latency_s * 1000:g} ms, "
            f"noise {self.noise:.1%}"
        )


REAL_SENSORS = SensorSpec()
"""The default: 100 ms refresh, whole period sampled, 2.4 ms per counter read, 1 % noise."""
IDEAL_SENSORS = SensorSpec(period_s=0.0, window=1.0, read_latency_s=0.0, noise=0.0)
"""An exact, continuous counter and instantaneous power: no real GPU shows this (opt-in)."""
SENSOR_MODES = {"real": REAL_SENSORS, "ideal": IDEAL_SENSORS}
"""Named sensor specs (`ZEUS_EMULATED_SENSORS`)."""


def sensor_spec(sensors: SensorSpec | str) -> SensorSpec:
    """A `SensorSpec`, or one of `SENSOR_MODES` by name ("real", "ideal")."""
    if isinstance(sensors, SensorSpec):
        return sensors
    try:
        return SENSOR_MODES[str(sensors).strip().lower()]
    except KeyError:
        raise GPUValueError(
            f"Unknown sensor mode {sensors!r}; valid: {', '.join(SENSOR_MODES)}"
        ) from None


class EnergyMeter:
    """The exact energy a GPU draws over time, and what its sensors show of it.

    The exact power is the idle power plus piecewise-constant busy segments (their power
    above idle). Segments may be added after the fact (`add`: a finished instruction) or
    opened and closed (`open`, `close`). A refresh that was already shown keeps its value;
    energy added later to a period already shown goes into the next refresh (the total is
    conserved), as a real counter's late accounting would.

    Not thread-safe: the owning GPU holds its lock around every call.
    """

    def __init__(
        self,
        idle_power_w: float,
        origin_s: float,
        sensors: SensorSpec,
        rng: np.random.Generator,
    ) -> None:
        self.idle_power_w = float(idle_power_w)
        self.origin_s = float(origin_s)
        self.sensors = sensors
        self._rng = rng
        self._segments: list[list[float]] = []
        """[start_s, end_s (inf while open), power above idle W], by start."""
        self._folded_j = 0.0
        """Above-idle energy of segments dropped from the list (they ended before `_fold_s`)."""
        self._fold_s = -math.inf
        period = sensors.period_s
        self._next_tick_s = origin_s + (float(rng.uniform(0.0, period)) if period > 0 else 0.0)
        """The next refresh (its phase is drawn per GPU)."""
        self._shown_j = 0.0
        """The counter as last refreshed, J since `origin_s`."""
        self._accounted_j = 0.0
        """Exact energy up to the last refresh, as known when it was shown."""
        self._last_step_j: float | None = None
        self._last_tick_s = origin_s

    # -- the exact history -----------------------------------------------------------------
    def add(self, start_s: float, end_s: float, power_w: float) -> None:
        """Power `power_w` (total, W) drawn over [start_s, end_s]."""
        if end_s > start_s:
            self._insert([float(start_s), float(end_s), float(power_w) - self.idle_power_w])

    def open(self, start_s: float, power_w: float) -> None:
        """Power `power_w` from `start_s` until `close` (one open segment at a time)."""
        self.close(start_s)
        self._insert([float(start_s), math.inf, float(power_w) - self.idle_power_w])

    def close(self, end_s: float, *, energy_j: float | None = None) -> None:
        """End the open segment at `end_s`; with `energy_j`, the segment's exact energy
        replaces its power × time (a clock switch inside it changed the power)."""
        for seg in self._segments:
            if seg[1] == math.inf:
                seg[1] = max(float(end_s), seg[0])
                if energy_j is not None and seg[1] > seg[0]:
                    seg[2] = energy_j / (seg[1] - seg[0]) - self.idle_power_w

    def open_start_s(self) -> float | None:
        """Where the open segment began (None: none is open)."""
        return next((seg[0] for seg in self._segments if seg[1] == math.inf), None)

    def _insert(self, seg: list[float]) -> None:
        if seg[0] < self._fold_s:  # too old to keep apart: book its energy now
            self._folded_j += seg[2] * (seg[1] - seg[0])
            return
        self._segments.append(seg)
        self._segments.sort(key=lambda s: s[0])
        if len(self._segments) > _MAX_SEGMENTS:  # nobody read the counter for a long while
            self._fold(self._segments[-1][0] - _FOLD_HORIZON_S)

    def exact_j(self, t_s: float | np.ndarray) -> float | np.ndarray:
        """Exact energy from the origin to time(s) `t_s`, J."""
        t = np.asarray(t_s, dtype=float)
        total = self.idle_power_w * (t - self.origin_s) + self._folded_j
        for start, end, extra in self._segments:
            total = total + extra * np.clip(np.minimum(t, end) - start, 0.0, None)
        return float(total) if np.ndim(total) == 0 else total

    def power_w(self, t_s: float) -> float:
        """Exact power at `t_s`."""
        extra = sum(s[2] for s in self._segments if s[0] <= t_s <= s[1])
        return self.idle_power_w + extra

    # -- what the sensors show -------------------------------------------------------------
    def _refresh(self, now_s: float) -> None:
        period = self.sensors.period_s
        if period <= 0 or now_s < self._next_tick_s:
            return
        count = int((now_s - self._next_tick_s) / period + 1e-9) + 1
        ticks = self._next_tick_s + period * np.arange(count)
        ends = self.exact_j(ticks)
        window = self.sensors.window
        if window >= 1.0:
            steps = np.diff(np.concatenate(([self._accounted_j], ends)))
        else:
            steps = (ends - self.exact_j(ticks - window * period)) / window
        if self.sensors.noise:
            steps = steps * (1.0 + self.sensors.noise * self._rng.standard_normal(count))
        steps = np.maximum(steps, 0.0)
        self._shown_j += float(steps.sum())
        self._accounted_j = float(ends[-1])
        self._last_step_j = float(steps[-1])
        self._last_tick_s = float(ticks[-1])
        self._next_tick_s = float(ticks[-1] + period)
        self._fold(self._last_tick_s - period)

    def _fold(self, before_s: float) -> None:
        """Book segments that ended before `before_s` into `_folded_j` (keeps lists short)."""
        keep = []
        for seg in self._segments:
            if seg[1] < before_s:
                self._folded_j += seg[2] * (seg[1] - seg[0])
            else:
                keep.append(seg)
        self._segments = keep
        self._fold_s = max(self._fold_s, before_s)

    def counter_j(self, now_s: float) -> float:
        """What the energy counter shows at `now_s`, J since the origin."""
        if self.sensors.period_s <= 0:
            value = float(self.exact_j(now_s))
            self._fold(now_s - 1.0)
            return value
        self._refresh(now_s)
        return self._shown_j

    def power_reading_w(self, now_s: float) -> float:
        """What a power reading shows at `now_s`: the last refresh's mean power (ideal: the
        exact power now; before the first refresh: idle)."""
        if self.sensors.period_s <= 0:
            return self.power_w(now_s)
        self._refresh(now_s)
        if self._last_step_j is None:
            return self.idle_power_w
        return self._last_step_j / self.sensors.period_s
