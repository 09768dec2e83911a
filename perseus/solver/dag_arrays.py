"""The DAG as arrays: padded adjacency tables and per-level longest-path steps.

`perseus.solver.problem.SolverProblem` keeps its DAG as padded predecessor/successor
tables (`padded_adjacency`) walked one topological generation at a time; `latest_of` and
`earliest_of` are one such step for many plans at once, with each edge's lag where a level
has any (`level_lags`).
"""

from __future__ import annotations

import numpy as np

__all__ = ["LevelLags", "earliest_of", "latest_of", "level_lags", "padded_adjacency", "rows_of"]


def rows_of(index: np.ndarray) -> np.ndarray | slice:
    """`index` as a slice when it is a run of consecutive integers, else unchanged."""
    if len(index) and np.all(np.diff(index) == 1):
        return slice(int(index[0]), int(index[-1]) + 1)
    return index


LevelLags = list[np.ndarray | None] | None
"""Per adjacency column of one level, its edges' lags (``None``: all zero; the whole list
``None``: no lag in the level)."""


def _lagged(
    times: np.ndarray, column: np.ndarray, lag: np.ndarray | None, sign: float
) -> np.ndarray:
    """``times[column] + sign·lag`` (a new array), the lag broadcast over plans."""
    out = times[column]
    if lag is not None:
        shaped = lag.reshape(lag.shape + (1,) * (out.ndim - 1))
        if sign > 0:
            out += shaped
        else:
            out -= shaped
    return out


def latest_of(times: np.ndarray, columns: list[np.ndarray], lags: LevelLags = None) -> np.ndarray:
    """Row-wise max of ``times[c] + lag_c`` over the adjacency columns (a new array)."""
    if lags is None:
        out = times[columns[0]]
        for c in columns[1:]:
            np.maximum(out, times[c], out=out)
        return out
    out = _lagged(times, columns[0], lags[0], 1.0)
    for c, lag in zip(columns[1:], lags[1:], strict=True):
        np.maximum(out, _lagged(times, c, lag, 1.0), out=out)
    return out


def earliest_of(times: np.ndarray, columns: list[np.ndarray], lags: LevelLags = None) -> np.ndarray:
    """Row-wise min of ``times[c] − lag_c`` over the adjacency columns (a new array)."""
    if lags is None:
        out = times[columns[0]]
        for c in columns[1:]:
            np.minimum(out, times[c], out=out)
        return out
    out = _lagged(times, columns[0], lags[0], -1.0)
    for c, lag in zip(columns[1:], lags[1:], strict=True):
        np.minimum(out, _lagged(times, c, lag, -1.0), out=out)
    return out


def level_lags(table: np.ndarray, rows: np.ndarray) -> LevelLags:
    """The lag columns of one level (see `LevelLags`)."""
    cols: list[np.ndarray | None] = []
    for c in range(table.shape[1]):
        lag = table[rows, c]
        cols.append(lag if lag.any() else None)
    return cols if any(c is not None for c in cols) else None


def padded_adjacency(n: int, rows: np.ndarray, cols: np.ndarray, fill: float = 0) -> np.ndarray:
    """Row k lists the `cols` paired with `rows == k` (in edge order), padded with `fill`.

    With node indices as `cols` and ``fill = n`` this is the adjacency table; with the
    edges' lags as `cols` and ``fill = 0``, the lag of each of its entries.
    """
    counts = np.bincount(rows, minlength=n) if len(rows) else np.zeros(n, dtype=np.int64)
    width = max(1, int(counts.max()) if n else 1)
    table = np.full((n, width), fill, dtype=cols.dtype)
    order = np.argsort(rows, kind="stable")
    r, c = rows[order], cols[order]
    starts = np.searchsorted(r, np.arange(n))
    pos = np.arange(len(r)) - starts[r]
    table[r, pos] = c
    return table
