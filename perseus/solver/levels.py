"""Per-level rounding tables: a topological level's rows of the staircase and hull tables.

`perseus.solver.rounding` walks the DAG one topological level at a time; for every level it
keeps the rows of its nodes' tables flattened and padded (`LevelRows`), so that picking
options for a whole level of many plans is a few gathers.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["Level", "LevelRows"]


class LevelRows:
    """One table row per instruction of a topological level, flattened and padded to a
    power-of-two width, so a ``(rows, K)`` array of positions gathers with one add.

    For rows of ascending times (built with ``fill=nan``), ``count_at_most(x)`` is
    ``(rows[:, :, None] <= x[:, None, :]).sum(axis=1)`` without the ``(rows, width, K)``
    temporary: a binary search by halving steps, one gather per step (same counts, about
    twice as fast on the 25–30-step staircases of real profiles). The NaN padding compares
    false with everything, so it is never counted, not even for ``x = +inf``.
    """

    def __init__(self, rows: np.ndarray, fill: float):
        count, width = rows.shape
        padded_width = 1 << width.bit_length()  # > width: the steps below sum to >= width
        padded = np.full((count, padded_width), fill, dtype=rows.dtype)
        padded[:, :width] = rows
        self.flat = padded.ravel()
        self.row_start = (np.arange(count, dtype=np.int64) * padded_width)[:, None]
        self.steps = [1 << b for b in reversed(range(width.bit_length()))]
        # Step s compares the entry s - 1 past the search position: a view shifted by
        # s - 1 saves an addition per step (and `take` beats fancy indexing by ~20 %).
        self._shifted = [self.flat[s - 1 :] for s in self.steps]

    def take(self, position: np.ndarray) -> np.ndarray:
        """Entries at `position` ``(rows, K)`` of each row."""
        return self.flat.take(self.row_start + position)

    def count_at_most(self, x: np.ndarray) -> np.ndarray:
        """For ``x`` ``(rows, K)``: how many entries of each row are ``<= x`` ``(rows, K)``."""
        at = np.empty(x.shape, dtype=np.int64)
        at[...] = self.row_start
        for s, shifted in zip(self.steps, self._shifted, strict=True):
            at += (shifted.take(at) <= x) * s
        return at - self.row_start


class Level(NamedTuple):
    """A topological level's instructions and their rows of the rounding tables."""

    index: np.ndarray | slice  # instruction indices (a slice when consecutive)
    preds: list[np.ndarray]  # adjacency columns (see SolverProblem.level_preds)
    succs: list[np.ndarray]
    pred_lags: list[np.ndarray | None] | None  # their edge lags (SolverProblem.level_pred_lags)
    succ_lags: list[np.ndarray | None] | None
    step_time: LevelRows  # staircase durations
    vertex_time: LevelRows  # hull vertex durations
    vertex_step: LevelRows  # staircase position of each hull vertex
