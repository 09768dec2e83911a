"""The one statistic of measured rounds: a median over a bounded window, a MAD for its spread.

Every judge of a job's measured figures uses these functions, so that they all judge the
same numbers: the promise guard (`perseus.schedulers.perseus_scheduler.guard`), the scheduler's summary line, the
energy report (`perseus.planning.report`: ``GET /jobs/{job_id}``, ``/metrics`` and
``perseus report``) and the tests.

- A round's **time** is the slowest rank's median iteration time (`rank_time`): one
  iteration the host stalled (a garbage collection, a busy CPU) does not move it, a plan
  that runs slower (every iteration) does. A round's **energy** is the mean energy per
  iteration, summed over every GPU: energy adds up, so its mean is what was spent.
- Over rounds, figures are the **median** of the newest `ROUND_WINDOW` rounds of a kind
  (all-max, or the plan running now): a bounded window, so nothing per job grows with the
  job's length and a machine's drift ages out.
- Their **spread** is the median absolute deviation, scaled by `MAD_SCALE` to estimate a
  normal σ (`robust_spread`): one disturbed round among the window does not widen it, which
  a standard deviation's square would (one round 20 % slow among five moves σ by ~9 %).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

__all__ = [
    "MAD_SCALE",
    "ROUND_WINDOW",
    "mean",
    "median",
    "rank_time",
    "robust_sigma",
    "robust_spread",
    "window_medians",
]

ROUND_WINDOW = 20
"""Rounds of a kind (all-max, the plan running now) the figures are medians of: the newest.
20 rounds of about a second each; all-max rounds come every `reference_every`-th round
while a plan runs, so the all-max window spans about 200 rounds (3 to 4 minutes)."""

MAD_SCALE = 1.4826
"""σ of a normal sample over its median absolute deviation (1 / Φ⁻¹(3/4))."""


def _finite(values: Iterable[float]) -> list[float]:
    return [v for v in values if math.isfinite(v)]


def median(values: Iterable[float]) -> float:
    """The median of the finite `values` (NaN when there is none)."""
    kept = _finite(values)
    return statistics.median(kept) if kept else math.nan


def mean(values: Iterable[float]) -> float | None:
    """The mean of `values` (None when empty or not finite)."""
    kept = list(values)
    if not kept:
        return None
    m = math.fsum(kept) / len(kept)
    return m if math.isfinite(m) else None


def rank_time(iter_time: Sequence[float]) -> float | None:
    """One rank's figure of a round's iteration times: their median (None: no finite one)."""
    kept = _finite(iter_time)
    return statistics.median(kept) if kept else None


def robust_sigma(values: Sequence[float]) -> float:
    """`MAD_SCALE` × the median absolute deviation of `values` (0 for fewer than two)."""
    kept = _finite(values)
    if len(kept) < 2:
        return 0.0
    mid = statistics.median(kept)
    return MAD_SCALE * statistics.median(abs(v - mid) for v in kept)


def robust_spread(values: Sequence[float]) -> float:
    """`robust_sigma` over the median: the relative round-to-round spread (0 for fewer than
    two values, infinite when the median is not positive)."""
    kept = _finite(values)
    if len(kept) < 2:
        return 0.0
    mid = statistics.median(kept)
    return robust_sigma(kept) / mid if mid > 0 else math.inf


def window_medians(
    times: Iterable[float], energies: Iterable[float], *, window: int = ROUND_WINDOW
) -> tuple[float, float]:
    """(median time, median energy) of the newest `window` rounds (oldest first, e.g. a
    bounded deque); NaN where there is none."""
    return median(list(times)[-window:]), median(list(energies)[-window:])
