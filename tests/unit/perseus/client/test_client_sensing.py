"""Watching the energy counter refresh, and cutting a round into energy windows."""

from __future__ import annotations

import threading
import time

import pytest

from perseus.client.gpu.sensing import (
    CounterPoller,
    Tick,
    energy_windows,
    mean_power_w,
    periodic_ticks,
)


class StepCounter:
    """A counter that refreshes every `period_s` on the host clock, reading `power_w` × time;
    a read takes `read_s` (its value is the one at the read's start)."""

    def __init__(self, period_s: float, power_w: float = 100.0, read_s: float = 0.001) -> None:
        self.period_s, self.power_w, self.read_s = period_s, power_w, read_s
        self.origin = time.perf_counter()
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        elapsed = time.perf_counter() - self.origin
        time.sleep(self.read_s)
        if self.period_s == 0:
            return elapsed * self.power_w * 1000
        return (elapsed // self.period_s) * self.period_s * self.power_w * 1000


def test_the_poller_measures_the_refresh_period_and_times_each_refresh():
    counter = StepCounter(0.04)
    poller = CounterPoller(counter)
    try:
        assert poller.wait_period(timeout_s=2.0) == pytest.approx(0.04, abs=0.004)
        time.sleep(0.5)
        ticks = poller.ticks(counter.origin, time.perf_counter())
        assert len(ticks) >= 10
        precise = [k for k in ticks if k.precise]  # a late wake-up leaves a wide bracket
        assert len(precise) >= 0.7 * len(ticks)
        for tick in precise:  # each refresh timed within its bracket
            assert tick.time_s - counter.origin == pytest.approx(
                round((tick.time_s - counter.origin) / 0.04) * 0.04, abs=0.004
            )
        # Once the period is known it reads in bursts around each refresh, not back to back
        # (that would be about 400 reads in 0.4 s).
        before = counter.reads
        time.sleep(0.4)
        assert counter.reads - before < 120
        # Its last value is the counter's now (it reads around every refresh).
        elapsed = time.perf_counter() - counter.origin
        if elapsed % 0.04 > 0.006:  # not right at a refresh
            assert poller.latest_mj() == pytest.approx((elapsed // 0.04) * 0.04 * 100.0 * 1000)
    finally:
        poller.close()


def test_a_continuous_counter_and_a_frozen_one():
    continuous = CounterPoller(StepCounter(0.0))
    try:
        assert continuous.wait_period(timeout_s=1.0) == 0.0
    finally:
        continuous.close()
    frozen = CounterPoller(lambda: 42.0)
    try:
        start = time.monotonic()
        assert frozen.wait_period(timeout_s=0.3) is None
        assert time.monotonic() - start < 1.0
    finally:
        frozen.close()


def test_a_failing_read_stops_the_poller_and_is_kept():
    calls = threading.Event()

    def broken() -> float:
        calls.set()
        raise RuntimeError("GPU is lost")

    poller = CounterPoller(broken)
    try:
        assert poller.wait_period(timeout_s=1.0) is None
        assert isinstance(poller.error, RuntimeError)
    finally:
        poller.close()


def _ticks(times: list[float], power_w: float = 100.0) -> list[Tick]:
    return [Tick(t, t * power_w * 1000, True, 0.002) for t in times]


def test_windows_hold_the_counter_difference_and_each_instructions_seconds():
    ticks = _ticks([0.0, 0.1, 0.2, 0.3])
    intervals = [(0, 0.05, 0.12), (1, 0.12, 0.25), (0, 0.25, 0.27)]
    windows = energy_windows(ticks, intervals, 2, start_s=0.0, end_s=0.3, tail=0.25)
    assert [w.energy_j for w in windows] == pytest.approx([10.0, 10.0, 10.0])
    assert [w.time_s for w in windows] == pytest.approx([0.1, 0.1, 0.1])
    assert [w.busy_s for w in windows] == [
        pytest.approx([0.05, 0.0]),
        pytest.approx([0.02, 0.08]),
        pytest.approx([0.02, 0.05]),
    ]
    # The last quarter of each period: [0.075, 0.1], [0.175, 0.2], [0.275, 0.3].
    assert [w.tail_s for w in windows] == pytest.approx([0.025] * 3)
    assert [w.tail_busy_s for w in windows] == [
        pytest.approx([0.025, 0.0]),
        pytest.approx([0.0, 0.025]),
        pytest.approx([0.0, 0.0]),
    ]


def test_windows_merge_close_refreshes_and_skip_imprecise_ones():
    continuous = [Tick(t / 1000, t * 100.0) for t in range(0, 101, 5)]  # every 5 ms
    windows = energy_windows(continuous, [], 1, start_s=0.0, end_s=0.1, min_window_s=0.02)
    assert [w.time_s for w in windows] == pytest.approx([0.02] * 5)
    ticks = [*_ticks([0.0, 0.1]), Tick(0.2, 20_000, precise=False), *_ticks([0.3])]
    windows = energy_windows(ticks, [], 1, start_s=0.0, end_s=0.3)
    assert [w.time_s for w in windows] == pytest.approx([0.1, 0.2])  # 0.2 is no boundary
    assert energy_windows(_ticks([0.0]), [], 1, start_s=0.0, end_s=1.0) == []


def test_periodic_refreshes_are_timed_by_the_line_through_their_brackets():
    true = [0.0137 + 0.1 * k for k in range(12)]
    offsets = [
        0.0011,
        -0.0009,
        0.0004,
        -0.0012,
        0.0008,
        0.0,
        -0.0005,
        0.001,
        -0.001,
        0.0003,
        0.0006,
        -0.0002,
    ]
    noisy = [
        Tick(t + d, 1000.0 * k, True, 0.0025)
        for k, (t, d) in enumerate(zip(true, offsets, strict=True))
    ]
    refined = periodic_ticks(noisy)
    worst_before = max(abs(k.time_s - t) for k, t in zip(noisy, true, strict=True))
    worst_after = max(abs(k.time_s - t) for k, t in zip(refined, true, strict=True))
    assert worst_after < worst_before / 2
    # Refreshes that are not periodic come back as they were.
    irregular = [Tick(t, 1.0 * k, True, 0.002) for k, t in enumerate([0.0, 0.1, 0.23, 0.3, 0.41])]
    assert periodic_ticks(irregular) == irregular


def test_a_rounds_mean_power_is_read_between_its_first_and_last_refresh():
    # 250 W between refreshes 0.1 s apart, seen through 2 ms brackets.
    ticks = [Tick(0.0137 + 0.1 * k, 25_000.0 * k, True, 0.002) for k in range(10)]
    assert mean_power_w(ticks, 1.0) == pytest.approx(250.0)
    # Fewer than two refreshes, or refreshes that span under half the round: no figure.
    assert mean_power_w(ticks[:1], 1.0) is None
    assert mean_power_w(ticks[:4], 1.0) is None
    assert mean_power_w([Tick(0.1, 0.0, False), Tick(0.9, 1.0, False)], 1.0) is None


def test_windows_carry_the_idle_seconds_after_each_instruction_ended():
    """Two instructions per 100 ms, each followed by a gap: 2 ms before the next (all in the
    first band), 48 ms (4 ms, 12 ms and 32 ms in the three bands): per band, per instruction."""
    from perseus.protocol import AFTER_WORK_EDGES_S, EnergyWindow

    assert AFTER_WORK_EDGES_S == (0.004, 0.016, 0.064)
    ticks = [Tick(0.1 * k, 1000.0 * k, True, 0.001) for k in range(5)]
    intervals = []
    for k in range(4):
        t = 0.1 * k
        intervals += [(0, t, t + 0.02), (1, t + 0.022, t + 0.052)]
    windows = energy_windows(ticks, intervals, 2, start_s=0.0, end_s=0.4)
    assert len(windows) == 4
    for w in windows:
        # index 0 ends at +20 ms, index 1 starts at +22 ms: 2 ms in band 0.
        # index 1 ends at +52 ms, the next window's index 0 starts at +100 ms: 48 ms.
        assert w.after_s[0] == pytest.approx([0.002, 0.004], abs=1e-9)
        assert w.after_s[1] == pytest.approx([0.0, 0.012], abs=1e-9)
        assert w.after_s[2] == pytest.approx([0.0, 0.032], abs=1e-9)
        assert sum(w.busy_s) + sum(map(sum, w.after_s)) <= w.time_s + 1e-12
    # The wire refuses after seconds that do not fit in the window's idle time.
    with pytest.raises(ValueError, match="after_s"):
        EnergyWindow(energy_j=1.0, time_s=0.1, busy_s=[0.09], after_s=[[0.02]])
    with pytest.raises(ValueError, match="one entry per entry"):
        EnergyWindow(energy_j=1.0, time_s=0.1, busy_s=[0.01, 0.01], after_s=[[0.02]])
