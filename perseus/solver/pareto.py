"""Candidate plans kept Pareto-optimal: time strictly increasing, energy strictly decreasing."""

from __future__ import annotations

import numpy as np

__all__ = ["ParetoStore"]


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
        order = np.lexsort((e, t))
        best_before = np.concatenate([[np.inf], np.minimum.accumulate(e[order])[:-1]])
        kept = order[e[order] < best_before]
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
