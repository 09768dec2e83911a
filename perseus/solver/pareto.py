"""Candidate plans kept Pareto-optimal: time strictly increasing, energy strictly decreasing."""

from __future__ import annotations

import numpy as np

__all__ = ["ParetoStore", "pareto_front"]


def pareto_front(time_s: np.ndarray, energy_j: np.ndarray, t_floor: float) -> np.ndarray:
    """Indices, in time order, of the plans at or above `t_floor` that no other one beats:
    each uses strictly less energy than every plan before it in (time, energy) order, so
    of equal plans the first is kept. A batch's own front holds every plan of it that can
    survive merging with any other plans (`ParetoStore.add`)."""
    at = np.flatnonzero(time_s >= t_floor)
    order = at[np.lexsort((energy_j[at], time_s[at]))]
    e = energy_j[order]
    best_before = np.concatenate([[np.inf], np.minimum.accumulate(e)[:-1]])
    return order[e < best_before]


class ParetoStore:
    """Candidate plans (option indices, one row per plan) kept Pareto-optimal."""

    def __init__(self, n: int, t_floor: float):
        self.t_floor = t_floor
        self.time = np.empty(0)
        self.energy = np.empty(0)
        self.compute = np.empty(0)
        self.choice = np.empty((0, n), dtype=np.int16)

    def add(
        self, time_s: np.ndarray, energy_j: np.ndarray, compute_j: np.ndarray, choice: np.ndarray
    ) -> None:
        """Merge plans ``choice`` (``(n, K)`` option indices) with their exact scores."""
        keep = time_s >= self.t_floor
        t = np.concatenate([self.time, time_s[keep]])
        e = np.concatenate([self.energy, energy_j[keep]])
        c = np.concatenate([self.compute, compute_j[keep]])
        kept = pareto_front(t, e, -np.inf)
        old = len(self.time)
        new_rows = choice[:, keep].T.astype(np.int16)
        from_old = kept[kept < old]
        from_new = kept[kept >= old] - old
        rows = np.concatenate([self.choice[from_old], new_rows[from_new]])
        # Restore time order (old and new survivors interleave).
        merged_t = np.concatenate([t[from_old], t[old + from_new]])
        resort = np.argsort(merged_t, kind="stable")
        self.time = merged_t[resort]
        self.energy = np.concatenate([e[from_old], e[old + from_new]])[resort]
        self.compute = np.concatenate([c[from_old], c[old + from_new]])[resort]
        self.choice = rows[resort]
