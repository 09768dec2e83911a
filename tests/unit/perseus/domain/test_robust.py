"""The one statistic of measured rounds (`perseus.domain.robust`)."""

from __future__ import annotations

import math
import statistics
from collections import deque

import pytest

from perseus.domain.robust import (
    MAD_SCALE,
    ROUND_WINDOW,
    rank_time,
    robust_sigma,
    robust_spread,
    window_medians,
)


def test_the_mad_estimates_a_normal_sigma_and_ignores_one_outlier():
    values = [1.0, 1.01, 0.99, 1.005, 0.995]
    assert robust_sigma(values) == pytest.approx(MAD_SCALE * 0.005)
    stalled = [*values, 1.5]  # one round of six 50 % slow
    assert robust_spread(stalled) < 0.012  # about the quiet rounds' 0.74 %
    assert statistics.stdev(stalled) / statistics.median(stalled) > 0.15  # what it replaced
    assert robust_spread([1.0]) == 0.0 and robust_spread([]) == 0.0
    assert robust_spread([0.0, 0.0, 1.0]) == math.inf


def test_a_rounds_time_is_the_median_iteration_one_stall_does_not_move_it():
    assert rank_time([0.1, 0.1, 0.1, 2.0]) == pytest.approx(0.1)
    assert rank_time([0.1, math.nan, 0.3]) == pytest.approx(0.2)
    assert rank_time([]) is None and rank_time([math.inf]) is None


def test_window_medians_take_the_newest_rounds_of_a_bounded_window():
    times = deque((1.0 + (k >= 100) for k in range(130)), maxlen=200)
    energies = deque(float(k) for k in range(130))
    t, e = window_medians(times, energies)
    assert t == 2.0  # only the newest ROUND_WINDOW rounds
    assert e == statistics.median(range(130 - ROUND_WINDOW, 130))
    assert all(math.isnan(x) for x in window_medians([], []))
