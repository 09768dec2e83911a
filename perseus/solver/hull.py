"""The effective cost of one option type: the convex hull the LP relaxation plans on."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["CostHull", "effective_cost_hull"]


@dataclass(frozen=True)
class CostHull:
    """Convex, non-increasing piecewise-linear effective cost of one option type.

    Vertices ``(time_s[k], cost_j[k])`` with ``time_s`` increasing and ``cost_j``
    decreasing; the cost is ``e − P_block·t`` and is constant to the right of the last
    vertex (running slower than that never pays under the LP).
    """

    time_s: np.ndarray
    cost_j: np.ndarray

    @property
    def slopes_w(self) -> np.ndarray:
        """Marginal cost of shortening, per segment, left to right (positive, decreasing)."""
        return -np.diff(self.cost_j) / np.diff(self.time_s)

    def __call__(self, duration_s: np.ndarray) -> np.ndarray:
        """Cost at `duration_s` (clamped into ``[time_s[0], ∞)``)."""
        return np.interp(duration_s, self.time_s, self.cost_j)


def effective_cost_hull(time_s: np.ndarray, energy_j: np.ndarray, p2p_power_w: float) -> CostHull:
    """Lower convex hull of the points ``(t, e − P·t)``, from the fastest point to its minimum.

    Any option (dominated or not) lies on or above the returned function extended as a
    constant to the right, so the LP built on it is a true lower bound.
    """
    t = np.asarray(time_s, dtype=float)
    c = np.asarray(energy_j, dtype=float) - p2p_power_w * t
    order = np.lexsort((c, t))
    pts: list[tuple[float, float]] = []
    for x, y in zip(t[order], c[order], strict=True):
        if pts and x == pts[-1][0]:
            continue  # same time, higher cost (sorted by cost within a time)
        while len(pts) >= 2:
            (x1, y1), (x2, y2) = pts[-2], pts[-1]
            # Drop the middle point when it is on or above the segment (x1,y1)-(x,y).
            if (y2 - y1) * (x - x1) >= (y - y1) * (x2 - x1):
                pts.pop()
            else:
                break
        pts.append((float(x), float(y)))
    costs = [p[1] for p in pts]
    last = int(np.argmin(costs))
    hull = np.array(pts[: last + 1])
    return CostHull(time_s=hull[:, 0].copy(), cost_j=hull[:, 1].copy())
