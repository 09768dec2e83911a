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

The exact power itself may decay after work stops (``EnergyMeter(decay_s=τ)``): from the end
of a busy segment until any segment is busy again, the power above idle is the segment's
times ``exp(−(t − end)/τ)``, integrated in closed form (``docs/emulator.md``, "Power after
work stops, and drift").
"""

from __future__ import annotations

import bisect
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
_TAIL_SPENT = 40.0
"""A tail older than this many time constants is spent (exp(−40) ≈ 4e-18 of it is left)."""


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

    The exact power is the idle power plus busy segments (their power above idle, constant
    over each) and, with ``decay_s`` = τ > 0, each segment's tail: from the segment's end
    until any segment is busy again (the next one to start, or one already running at that
    end), the power above idle decays as ``extra · exp(−(t − end)/τ)``. Segments may be added
    after the fact (`add`: a finished instruction) or opened and closed (`open`, `close`).
    A refresh that was already shown keeps its value; energy added later to a period already
    shown goes into the next refresh (the total is conserved), as a real counter's late
    accounting would. A segment booked late can also cut a tail already shown: the counter
    then owes that energy and the following refreshes pay it back (it never runs backwards).

    Not thread-safe: the owning GPU holds its lock around every call.
    """

    def __init__(
        self,
        idle_power_w: float,
        origin_s: float,
        sensors: SensorSpec,
        rng: np.random.Generator,
        *,
        decay_s: float = 0.0,
    ) -> None:
        if not (math.isfinite(decay_s) and decay_s >= 0.0):
            raise GPUValueError(f"decay_s={decay_s!r} must be finite and >= 0")
        self.idle_power_w = float(idle_power_w)
        self.origin_s = float(origin_s)
        self.sensors = sensors
        self.decay_s = float(decay_s)
        """Time constant of the power's decay after work stops (0: it drops to idle at once)."""
        self._rng = rng
        self._segments: list[list[float]] = []
        """[start_s, end_s (inf while open), power above idle W], by start."""
        self._folded_j = 0.0
        """Above-idle energy (tails included) of segments dropped from the list."""
        self._fold_s = -math.inf
        period = sensors.period_s
        self._next_tick_s = origin_s + (float(rng.uniform(0.0, period)) if period > 0 else 0.0)
        """The next refresh (its phase is drawn per GPU)."""
        self._shown_j = 0.0
        """The counter as last refreshed, J since `origin_s`."""
        self._accounted_j = 0.0
        """Exact energy up to the last refresh, as known when it was shown."""
        self._owed_j = 0.0
        """Energy shown that a later booking took back (a cut tail): paid by the next steps."""
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
        if seg[1] < self._fold_s:  # ended before the folded past: book its energy now
            self._folded_j += seg[2] * (seg[1] - seg[0])
            if self.decay_s > 0:  # its tail, up to the first kept segment after it
                starts = [s[0] for s in self._segments]
                after = bisect.bisect_left(starts, seg[1])
                cut = starts[after] if after < len(starts) else math.inf
                self._folded_j += (
                    max(seg[2], 0.0) * self.decay_s * -math.expm1(-(cut - seg[1]) / self.decay_s)
                )
            return
        bisect.insort(self._segments, seg, key=lambda s: s[0])
        if len(self._segments) > _MAX_SEGMENTS:  # nobody read the counter for a long while
            self._fold(self._segments[-1][0] - _FOLD_HORIZON_S)

    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """(starts, ends, power above idle, tail cuts or None without decay) of the kept
        segments, by start."""
        a = np.array(self._segments, dtype=float).reshape(len(self._segments), 3)
        starts, ends = a[:, 0], a[:, 1]
        cuts = self._cuts(starts, ends) if self.decay_s > 0 else None
        return starts, ends, a[:, 2], cuts

    @staticmethod
    def _cuts(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Where each segment's tail ends: its own end when another segment runs at that
        moment, else the next start after it (inf: none yet)."""
        n = len(starts)
        begun = np.searchsorted(starts, ends, side="right")  # segments started by each end
        latest_end = np.maximum.accumulate(ends)
        covered = latest_end[np.maximum(begun - 1, 0)] > ends
        after = np.searchsorted(starts, ends, side="left")
        nxt = np.where(after < n, starts[np.minimum(after, n - 1)], math.inf)
        return np.where(covered, ends, nxt)

    def _tails_j(
        self, t: np.ndarray, ends: np.ndarray, extra: np.ndarray, cuts: np.ndarray
    ) -> np.ndarray:
        """Each tail's energy from its segment's end up to `t` (closed form)."""
        span = np.clip(np.minimum(t, cuts) - ends, 0.0, None)  # an open segment's end is inf
        return np.clip(extra, 0.0, None) * self.decay_s * -np.expm1(-span / self.decay_s)

    def exact_j(self, t_s: float | np.ndarray) -> float | np.ndarray:
        """Exact energy from the origin to time(s) `t_s`, J."""
        return self._exact_j(t_s, self._arrays() if self._segments else None)

    def _exact_j(self, t_s: float | np.ndarray, arrays: tuple | None) -> float | np.ndarray:
        t = np.asarray(t_s, dtype=float)
        total = self.idle_power_w * (t - self.origin_s) + self._folded_j
        if arrays is not None:
            starts, ends, extra, cuts = arrays
            tt = t[..., None]
            busy = extra * np.clip(np.minimum(tt, ends) - starts, 0.0, None)
            total = total + busy.sum(axis=-1)
            if cuts is not None:
                total = total + self._tails_j(tt, ends, extra, cuts).sum(axis=-1)
        return float(total) if np.ndim(total) == 0 else total

    def power_w(self, t_s: float) -> float:
        """Exact power at `t_s`."""
        extra = sum(s[2] for s in self._segments if s[0] <= t_s <= s[1])
        if self.decay_s > 0 and self._segments:
            _, ends, above, cuts = self._arrays()
            live = (ends < t_s) & (t_s < cuts)
            decay = np.exp(-(t_s - ends[live]) / self.decay_s)
            extra += float((np.clip(above[live], 0.0, None) * decay).sum())
        return self.idle_power_w + extra

    # -- what the sensors show -------------------------------------------------------------
    def _refresh(self, now_s: float) -> None:
        period = self.sensors.period_s
        if period <= 0 or now_s < self._next_tick_s:
            return
        count = int((now_s - self._next_tick_s) / period + 1e-9) + 1
        ticks = self._next_tick_s + period * np.arange(count)
        arrays = self._arrays() if self._segments else None
        ends = self._exact_j(ticks, arrays)
        window = self.sensors.window
        if window >= 1.0:
            steps = np.diff(np.concatenate(([self._accounted_j], ends)))
        else:
            steps = (ends - self._exact_j(ticks - window * period, arrays)) / window
        if self.sensors.noise:
            steps = steps * (1.0 + self.sensors.noise * self._rng.standard_normal(count))
        # The counter never runs backwards: a negative step (a tail cut after it was shown,
        # or noise) is owed, and paid back by the steps after it.
        due = np.cumsum(steps) - self._owed_j
        shown = np.maximum.accumulate(np.maximum(due, 0.0))
        self._owed_j = float(shown[-1] - due[-1])
        self._shown_j += float(shown[-1])
        self._accounted_j = float(ends[-1])
        self._last_step_j = float(shown[-1] - (shown[-2] if count > 1 else 0.0))
        self._last_tick_s = float(ticks[-1])
        self._next_tick_s = float(ticks[-1] + period)
        self._fold(self._last_tick_s - period, arrays)

    def _fold(self, before_s: float, arrays: tuple | None = None) -> None:
        """Book segments done before `before_s` into `_folded_j` (keeps lists short): those
        that ended before it and, with a decay, whose tail was cut (or spent) before it.
        `arrays`: `_arrays()` of the segments as they are, if the caller has them."""
        if self._segments:
            starts, ends, extra, cuts = self._arrays() if arrays is None else arrays
            if cuts is not None:
                done = (cuts < before_s) | (ends + _TAIL_SPENT * self.decay_s < before_s)
            else:
                done = ends < before_s
            if done.any():
                s, e, x = starts[done], ends[done], extra[done]
                energy = float((x * (e - s)).sum())
                if cuts is not None:  # each tail up to its cut (inf: spent)
                    energy += float(self._tails_j(np.asarray(math.inf), e, x, cuts[done]).sum())
                self._folded_j += energy
                self._segments = [s for s, d in zip(self._segments, done, strict=True) if not d]
        self._fold_s = max(self._fold_s, before_s)

    def counter_j(self, now_s: float) -> float:
        """What the energy counter shows at `now_s`, J since the origin."""
        if self.sensors.period_s <= 0:
            # Exact, but never backwards (a tail cut by work booked late is taken back).
            arrays = self._arrays() if self._segments else None
            self._shown_j = max(self._shown_j, float(self._exact_j(now_s, arrays)))
            self._fold(now_s - 1.0, arrays)
            return self._shown_j
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
