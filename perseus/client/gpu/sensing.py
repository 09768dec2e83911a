"""Reading the energy counter as a real GPU shows it: refreshes ("ticks") and energy windows.

A GPU's energy counter does not move continuously: on the H100 we measured it refreshes every
100 ms, and one read takes 2.4 ms (``docs/measurements/h100-2026-11-24``). Reading it around
an instruction of a few milliseconds gives 0 or a whole refresh. What it does give exactly
is the energy between two refreshes. So a rank:

1. polls the counter on a background thread (`CounterPoller`) and notes when its value
   changes: a refresh, timed to within half the time between two reads. Once the period is
   known the poller sleeps until just before the next refresh is due and reads back to back
   only around it (a few reads per refresh instead of one every 2.4 ms);
2. keeps its instructions' start and end times (host clock, like the refreshes);
3. at a round's end cuts the round at its refreshes into windows (`energy_windows`): each
   window's energy (the counter's difference, exact up to the sensor's noise) and, per
   instruction of the iteration order, the seconds it ran inside the window.

The coordinator then fits every (stage, kind, clock)'s power to these windows
(`perseus.schedulers.sweep.power_fit`). Each window also carries the seconds each instruction ran in the
last `SAMPLED_TAIL` of each refresh period inside it: on A100 and H100 the sensor samples only
that part of a period (arXiv 2312.02741), and the fit picks whichever model explains the
readings. `wait_period` measures the refresh period at start (three refreshes, a few hundred
ms); the rank reports it so the coordinator can size rounds (`RankInfo.energy_refresh_s`).
"""

from __future__ import annotations

import bisect
import itertools
import logging
import random
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from perseus.protocol import AFTER_WORK_EDGES_S, MAX_WINDOWS, SAMPLED_TAIL, EnergyWindow

__all__ = [
    "CONTINUOUS_BELOW_S",
    "CounterPoller",
    "Tick",
    "energy_windows",
    "mean_power_w",
    "periodic_ticks",
]

logger = logging.getLogger(__name__)

CONTINUOUS_BELOW_S = 0.005
"""A counter that changes more often than this is continuous (exact at every read)."""
_LEARN_POLL_S = 0.001
"""Sleep between reads while the period is unknown."""
_CONTINUOUS_POLL_S = 0.02
"""Sleep between reads of a continuous counter (every read is a tick)."""
_BURST_POLL_S = 0.0002
"""Sleep between reads while a refresh is due (NVML's own 2.4 ms per read dominates)."""
_PRECISE_S = 0.008
"""A tick whose bracket (time between the reads before and after it) is wider is imprecise."""
_KEEP_TICKS = 200_000


@dataclass(frozen=True)
class Tick:
    """The counter showed `energy_mj` from `time_s` (host `perf_counter` seconds) on.

    `precise`: the refresh's time is known to within `_PRECISE_S` (it fell between two
    reads close together); an imprecise tick is never used as a window boundary.
    """

    time_s: float
    energy_mj: float
    precise: bool = True
    width_s: float = 0.0
    """How long the bracket was: the refresh happened within ±`width_s`/2 of `time_s`."""


class CounterPoller:
    """Polls one GPU's energy counter on a daemon thread and records its refreshes.

    Args:
        read_mj: Reads the counter, in millijoules (e.g. `GPU.total_energy_mj`).
        name: The thread's name.
        clock: The host clock the hook times instructions with.
    """

    def __init__(
        self,
        read_mj: Callable[[], float],
        *,
        name: str = "perseus-counter",
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._read = read_mj
        self._clock = clock
        self._ticks: list[Tick] = []
        self._lock = threading.Lock()
        self._seen = threading.Condition(self._lock)
        self._stop = threading.Event()
        self.period_s: float | None = None
        """The refresh period once measured (0.0: a continuous counter)."""
        self.read_s = 0.0
        """How long one read takes (median of the first ones)."""
        self.error: BaseException | None = None
        """What stopped the thread, if a read failed."""
        self._guard = 0.004
        self._latest: float | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        try:
            self._poll()
        except BaseException as exc:  # reported by the hook at the round's end
            self.error = exc
            with self._seen:
                self._seen.notify_all()

    def _poll(self) -> None:
        prev_t, prev_v = self._clock(), self._read()
        self._latest = prev_v
        reads: list[float] = []
        while not self._stop.is_set():
            t = self._clock()
            v = self._read()
            self._latest = v
            reads.append(self._clock() - t)
            if len(reads) == 20:
                self.read_s = statistics.median(reads)
            period = self.period_s
            if period == 0.0:  # continuous: the value read is the value then
                self._add(Tick(t, v))
            elif v != prev_v:
                width = t - prev_t
                self._add(Tick(0.5 * (prev_t + t), v, precise=width <= _PRECISE_S, width_s=width))
            prev_t, prev_v = t, v
            self._stop.wait(self._pause(t))

    def _pause(self, now: float) -> float:
        period = self.period_s
        if period is None:
            return _LEARN_POLL_S
        if period == 0.0:
            return _CONTINUOUS_POLL_S
        with self._lock:
            last = next((k for k in reversed(self._ticks) if k.precise), None)
        if last is None:
            return _LEARN_POLL_S
        # Sleep until a little before the next refresh is due, then read back to back until
        # it shows (a late or missed one: until it shows, however long that takes).
        start = last.time_s + period - self._guard
        return max(start - now, _BURST_POLL_S)

    def _add(self, tick: Tick) -> None:
        # The next burst starts early by a random part of one read more: the refresh then
        # falls anywhere within its bracket, so the brackets' midpoints are unbiased and the
        # line through them (`periodic_ticks`) times it well.
        read = max(self.read_s, 0.001)
        self._guard = max(0.004, 2.5 * read) + random.uniform(0.0, read)
        with self._seen:
            self._ticks.append(tick)
            if len(self._ticks) > _KEEP_TICKS:
                del self._ticks[: len(self._ticks) - _KEEP_TICKS]
            if self.period_s is None:
                self._learn()
            self._seen.notify_all()

    def _learn(self) -> None:
        """Call with the lock held: the period from the first refreshes seen."""
        times = [k.time_s for k in self._ticks if k.precise]
        if len(times) < 4:
            return
        gaps = [b - a for a, b in itertools.pairwise(times)]
        median = statistics.median(gaps)
        self.period_s = 0.0 if median < CONTINUOUS_BELOW_S else median

    # ------------------------------------------------------------------ the hook's side
    def wait_period(self, timeout_s: float = 2.0) -> float | None:
        """Wait until the refresh period is known; None if the counter did not change
        three times within `timeout_s` (or the reads failed)."""
        deadline = time.monotonic() + timeout_s
        with self._seen:
            while self.period_s is None and self.error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._seen.wait(left)
        return self.period_s

    def latest_mj(self) -> float | None:
        """The counter as last read (None before the first read). For a counter that
        refreshes, this is its value now: the poller reads around every refresh."""
        return self._latest

    def ticks(self, start_s: float, end_s: float) -> list[Tick]:
        """The refreshes seen between `start_s` and `end_s` (host clock), in order."""
        with self._lock:
            times = [k.time_s for k in self._ticks]
            lo = bisect.bisect_left(times, start_s)
            hi = bisect.bisect_right(times, end_s)
            return self._ticks[lo:hi]

    def forget(self, before_s: float) -> None:
        """Drop the refreshes before `before_s`."""
        with self._lock:
            times = [k.time_s for k in self._ticks]
            del self._ticks[: bisect.bisect_left(times, before_s)]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)


def periodic_ticks(ticks: Sequence[Tick], *, slack_s: float = 0.0005) -> list[Tick]:
    """The ticks with their times read off the line through them, when they are periodic.

    A refresh is only known to lie within its bracket (two reads, 2.4 ms apart on an H100),
    and that jitter in the windows' boundaries biases the fit (errors in the regressors).
    A counter that refreshes at a steady period puts every refresh on one line
    ``t_k = φ + k·Δ``; fitted to the brackets' midpoints (weighted by their widths), the
    line times every refresh far better than its own bracket does. It is used only if every
    bracket contains it (within `slack_s`); otherwise the ticks come back as they were.
    """
    precise = [k for k in ticks if k.precise and k.width_s > 0]
    if len(precise) < 4:
        return list(ticks)
    times = np.array([k.time_s for k in precise])
    gaps = np.diff(times)
    period = float(np.median(gaps))
    if period < CONTINUOUS_BELOW_S:
        return list(ticks)
    steps = np.rint(gaps / period)
    if np.any(steps < 1):
        return list(ticks)
    index = np.concatenate(([0.0], np.cumsum(steps)))
    period = float(np.sum(gaps) / index[-1])
    widths = np.array([k.width_s for k in precise])
    weights = 1.0 / np.maximum(widths, 1e-6) ** 2
    design = np.column_stack([np.ones_like(index), index]) * np.sqrt(weights)[:, None]
    coef, *_ = np.linalg.lstsq(design, times * np.sqrt(weights), rcond=None)
    fitted = coef[0] + coef[1] * index
    if np.any(np.abs(fitted - times) > widths / 2 + slack_s):
        return list(ticks)
    refined = {id(k): float(f) for k, f in zip(precise, fitted, strict=True)}
    return [Tick(refined[id(k)], k.energy_mj, True, 0.0) if id(k) in refined else k for k in ticks]


def mean_power_w(ticks: Sequence[Tick], span_s: float) -> float | None:
    """The mean power between the first and the last refresh of `ticks` (refresh-timed,
    see `periodic_ticks`), or None when they cover less than half of `span_s`.

    Two reads of a counter that refreshes every 100 ms each lag the moment they were taken
    by up to a period: the difference of two reads around a 1 s round is off by a few %,
    the difference between two refreshes only by the sensor's noise."""
    timed = [k for k in periodic_ticks(ticks) if k.precise]
    if len(timed) < 2:
        return None
    first, last = timed[0], timed[-1]
    elapsed_s = last.time_s - first.time_s
    if elapsed_s <= 0 or elapsed_s < 0.5 * span_s:
        return None
    return (last.energy_mj - first.energy_mj) / 1000.0 / elapsed_s


def _busy_until(starts: np.ndarray, ends: np.ndarray, cum: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Seconds of the (sorted, disjoint) intervals before each time `t`."""
    k = np.searchsorted(starts, t, side="right")  # intervals started by t
    done = cum[k]  # their whole durations
    last = np.clip(k - 1, 0, None)
    running = (k > 0) & (ends[last] > t)
    return done - np.where(running, ends[last] - t, 0.0)


def energy_windows(
    ticks: Sequence[Tick],
    intervals: Sequence[tuple[int, float, float]],
    num_indices: int,
    *,
    start_s: float,
    end_s: float,
    settle_s: float = 0.0,
    min_window_s: float = 0.02,
    tail: float = SAMPLED_TAIL,
    max_windows: int = MAX_WINDOWS,
) -> list[EnergyWindow]:
    """Cut [start_s, end_s] at the counter's refreshes into windows (see the module docstring).

    Args:
        ticks: The refreshes (`CounterPoller.ticks`), in time order.
        intervals: ``(index, start, end)`` of every instruction run, index in the rank's
            iteration order (0 .. `num_indices` − 1), times on the ticks' clock.
        start_s, end_s: The round's span; windows lie inside it.
        settle_s: The GPU's clock switch: the windows begin this long after the first
            instruction started. The clock change a round starts with is made once, and
            its seconds at the last round's clock would otherwise be charged to every window
            of the round (`perseus.schedulers.measurement.window_shares`).
        min_window_s: Consecutive refreshes closer than this are merged into one window
            (a continuous counter is read every few ms); raised so that at most
            `max_windows` windows come out.
        tail: The share of each refresh period whose busy seconds go to `tail_busy_s`.
    """
    if intervals and settle_s > 0:
        start_s = max(start_s, min(a for _, a, _ in intervals) + settle_s)
    ticks = periodic_ticks([k for k in ticks if start_s <= k.time_s <= end_s])
    bounds = [k for k in ticks if k.precise]
    if len(bounds) < 2:
        return []
    span = bounds[-1].time_s - bounds[0].time_s
    min_window_s = max(min_window_s, span / max_windows)
    all_times = np.array([k.time_s for k in ticks])
    # Greedy merge: a window closes at the first boundary at least min_window_s on.
    cuts = [bounds[0]]
    for tick in bounds[1:]:
        if tick.time_s - cuts[-1].time_s >= min_window_s * (1 - 1e-9):
            cuts.append(tick)
    if len(cuts) < 2:
        return []
    # Per index, its intervals (sorted, disjoint: one GPU runs one instruction at a time).
    per_index: list[list[tuple[float, float]]] = [[] for _ in range(num_indices)]
    for index, a, b in intervals:
        if b > a:
            per_index[index].append((a, b))
    cut_t = np.array([c.time_s for c in cuts])
    # Each refresh (every tick in the span, imprecise ones included) samples its period's tail.
    steps_end = all_times[(all_times > cut_t[0]) & (all_times <= cut_t[-1])]
    steps_start = np.concatenate(([cut_t[0]], steps_end[:-1]))
    tail_start = steps_end - tail * (steps_end - steps_start)
    owner = np.searchsorted(cut_t, steps_end, side="left") - 1  # window of each step
    nwin = len(cuts) - 1
    busy = np.zeros((nwin, num_indices))
    tail_busy = np.zeros((nwin, num_indices))
    for index, spans in enumerate(per_index):
        if not spans:
            continue
        spans.sort()
        starts = np.array([a for a, _ in spans])
        ends = np.array([b for _, b in spans])
        cum = np.concatenate(([0.0], np.cumsum(ends - starts)))
        at_cuts = _busy_until(starts, ends, cum, cut_t)
        busy[:, index] = np.diff(at_cuts)
        in_tail = _busy_until(starts, ends, cum, steps_end) - _busy_until(
            starts, ends, cum, tail_start
        )
        np.add.at(tail_busy[:, index], owner, in_tail)
    tail_len = np.zeros(nwin)
    np.add.at(tail_len, owner, steps_end - tail_start)
    after, tail_after = _after_work(
        intervals, num_indices, cut_t, steps_end, tail_start, owner, nwin
    )
    windows = []
    for w in range(nwin):
        a, b = cuts[w], cuts[w + 1]
        time_s = b.time_s - a.time_s
        # After-work seconds are idle seconds: never more than the window's busy seconds leave.
        idle_s = max(time_s - float(np.clip(busy[w], 0.0, None).sum()), 0.0)
        if after[w].sum() > idle_s:
            after[w] *= idle_s / after[w].sum() * (1 - 1e-9)
        idle_tail_s = max(float(tail_len[w]) - float(np.clip(tail_busy[w], 0.0, None).sum()), 0.0)
        if tail_after[w].sum() > idle_tail_s:
            tail_after[w] *= idle_tail_s / tail_after[w].sum() * (1 - 1e-9)
        windows.append(
            EnergyWindow(
                energy_j=max(0.0, (b.energy_mj - a.energy_mj) / 1000.0),
                time_s=time_s,
                busy_s=[min(float(x), time_s) for x in np.clip(busy[w], 0.0, None)],
                tail_s=float(tail_len[w]),
                tail_busy_s=[
                    min(float(x), float(tail_len[w])) for x in np.clip(tail_busy[w], 0.0, None)
                ],
                after_s=[[float(x) for x in band] for band in after[w]],
                tail_after_s=[[float(x) for x in band] for band in tail_after[w]],
            )
        )
    return windows


def _after_work(
    intervals: Sequence[tuple[int, float, float]],
    num_indices: int,
    cut_t: np.ndarray,
    steps_end: np.ndarray,
    tail_start: np.ndarray,
    owner: np.ndarray,
    nwin: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Per window, band of `AFTER_WORK_EDGES_S` and instruction index, the idle seconds in
    that band after an instruction of that index ended (until the next began), in the whole
    window and in its tails."""
    bands = len(AFTER_WORK_EDGES_S)
    after = np.zeros((nwin, bands, num_indices))
    tail_after = np.zeros_like(after)
    spans = sorted((a, b, i) for i, a, b in intervals if b > a)
    if not spans:
        return after, tail_after
    index = np.array([i for _, _, i in spans])
    ends = np.array([b for _, b, _ in spans])
    next_start = np.array([a for a, _, _ in spans[1:]] + [np.inf])
    low = 0.0
    for band, high in enumerate(AFTER_WORK_EDGES_S):
        starts = np.minimum(ends + low, next_start)
        stops = np.minimum(ends + high, next_start)
        for i in np.unique(index):
            mine = (index == i) & (stops > starts)
            if not mine.any():
                continue
            a, b = starts[mine], stops[mine]
            cum = np.concatenate(([0.0], np.cumsum(b - a)))
            after[:, band, i] = np.clip(np.diff(_busy_until(a, b, cum, cut_t)), 0.0, None)
            in_tail = _busy_until(a, b, cum, steps_end) - _busy_until(a, b, cum, tail_start)
            np.add.at(tail_after[:, band, i], owner, np.clip(in_tail, 0.0, None))
        low = high
    return after, tail_after
