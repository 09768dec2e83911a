"""The solver's problem: a DAG whose nodes each run one of a table of options.

The input is generic (`perseus.planning` builds it from a profile and a pipeline schedule):

- nodes ``0..n-1``, numbered in a topological order of the DAG, and its edges;
- every node's option *type*; per type an `OptionTable` of options, each with a time (s),
  an energy (J) and an integer label (for clock plans the SM frequency, in MHz). The option
  with the largest label is the *reference* option (the maximum frequency): its plan is the
  baseline the frontier reports beside its points. Nothing assumes options are monotone in
  their label: the fastest option of a type may have any label (a power-capped top clock
  runs slower than the one below it);
- the blocking power ``P`` (W) every resource draws while it is not running a node;
- the resources (for pipelines the GPUs of the stages), each an ordered index array of the
  nodes it runs. Only their count ``S`` enters the accounting;
- optionally a *lag* (s) per edge ``(u, v)``: ``v`` may start only ``lag(u, v)`` after ``u``
  finishes (for pipelines the P2P hop latency between two ranks). Default: all zero.

Everything the LP, the rounding and the exact scoring need is turned into numpy arrays
once: the DAG is kept as padded predecessor/successor tables plus its topological
*generations* (``levels``): nodes of one generation have no edges among them, so a
longest-path pass is one vectorised step per generation, for many plans at once.

`score` is the project's one implementation of a plan's accounting: ``T`` = longest path
(earliest starts, every edge's lag on it), ``E = Σ eᵢ + P·(S·T − Σ tᵢ)``, with the sums taken
one node at a time in topological order (`perseus.planning.evaluate` reports exactly these
numbers). A lag is time no node runs: a resource waiting on it draws the blocking power,
like any other wait.

Lags are kept per adjacency column and level only where they are non-zero, so a problem
without lags runs exactly the arithmetic it ran before lags existed (bit-identical results).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from perseus.errors import SolverError
from perseus.solver.dag_arrays import (
    earliest_of,
    latest_of,
    level_lags,
    padded_adjacency,
    rows_of,
)
from perseus.solver.hull import CostHull, effective_cost_hull

__all__ = ["Accounting", "OptionTable", "SolverProblem"]


@dataclass(frozen=True)
class OptionTable:
    """The options of one node type: time (s), energy (J) and an integer label each."""

    time_s: np.ndarray
    energy_j: np.ndarray
    label: np.ndarray

    def __len__(self) -> int:
        return len(self.label)


class Accounting(NamedTuple):
    """The exact accounting of plans (arrays over plans; see `SolverProblem.account`)."""

    iteration_time_s: np.ndarray
    energy_j: np.ndarray
    compute_energy_j: np.ndarray
    blocking_energy_j: np.ndarray


class SolverProblem:
    """Arrays for one DAG + option tables + blocking power. Build with `SolverProblem.build`."""

    def __init__(
        self,
        *,
        p2p_power_w: float,
        type_options: list[OptionTable],
        type_of: np.ndarray,
        preds: np.ndarray,
        succs: np.ndarray,
        edges: np.ndarray,
        levels: list[np.ndarray],
        level_of: np.ndarray,
        resources: list[np.ndarray],
        lead_ramp: np.ndarray,
        edge_lag_s: np.ndarray | None = None,
    ):
        self.p2p_power_w = float(p2p_power_w)
        self.n = len(type_of)
        self.type_options = type_options
        self.type_of = type_of
        self.preds = preds
        self.succs = succs
        self.edges = edges
        self.levels = levels
        # The same levels as slices where their nodes are numbered consecutively (always,
        # with the schedules' generation-by-generation topological order): the hot loops
        # then read and write views instead of fancy-index copies.
        self.level_rows: list[np.ndarray | slice] = [rows_of(lv) for lv in levels]
        self.level_of = level_of
        # Per level, one index array per adjacency column: the max/min over a level's
        # predecessors/successors as a few elementwise ops instead of an axis reduction.
        self.level_preds = [[preds[lv, c] for c in range(preds.shape[1])] for lv in levels]
        self.level_succs = [[succs[lv, c] for c in range(succs.shape[1])] for lv in levels]
        self._set_lags(edge_lag_s)
        self.resources = resources
        self.num_resources = len(resources)
        self.lead_ramp = lead_ramp
        width = max(len(o) for o in type_options)
        ntypes = len(type_options)
        self.opt_time = np.full((ntypes, width), np.inf)
        self.opt_energy = np.full((ntypes, width), np.inf)
        self.opt_label = np.zeros((ntypes, width), dtype=np.int64)
        self.opt_count = np.array([len(o) for o in type_options], dtype=np.int64)
        for k, o in enumerate(type_options):
            self.opt_time[k, : len(o)] = o.time_s
            self.opt_energy[k, : len(o)] = o.energy_j
            self.opt_label[k, : len(o)] = o.label
        self._hulls: list[CostHull] | None = None

    def _set_lags(self, edge_lag_s: np.ndarray | None) -> None:
        """Lay out the edge lags (validated) beside the adjacency tables.

        ``edge_lag_s`` (per edge, s; ``None``: all zero); ``pred_lag`` / ``succ_lag`` are
        the lag of each entry of ``preds`` / ``succs`` (0 for padding), ``None`` when every
        lag is zero; ``level_pred_lags[l][c]`` the lags of level ``l``'s adjacency column
        ``c``, ``None`` where they are all zero (the hot loops then skip the addition).
        """
        m = len(self.edges)
        if edge_lag_s is None:
            lag = np.zeros(m)
        else:
            lag = np.asarray(edge_lag_s, dtype=float)
            if lag.shape != (m,):
                raise SolverError(
                    f"edge_lag_s needs one lag per edge ({m}), got an array of shape {lag.shape}"
                )
            bad = np.flatnonzero(~np.isfinite(lag) | (lag < 0))
            if len(bad):
                u, v = self.edges[bad[0]]
                raise SolverError(
                    f"Edge lags must be finite numbers of seconds >= 0; edge ({u}, {v}) has "
                    f"{float(lag[bad[0]])!r}"
                )
        self.edge_lag_s = lag
        self.pred_lag: np.ndarray | None = None
        self.succ_lag: np.ndarray | None = None
        self.level_pred_lags: list[list[np.ndarray | None] | None] = [None] * len(self.levels)
        self.level_succ_lags: list[list[np.ndarray | None] | None] = [None] * len(self.levels)
        if not lag.any():
            return
        n = self.n
        self.pred_lag = padded_adjacency(n, self.edges[:, 1], lag)
        self.succ_lag = padded_adjacency(n, self.edges[:, 0], lag)
        self.level_pred_lags = [level_lags(self.pred_lag, lv) for lv in self.levels]
        self.level_succ_lags = [level_lags(self.succ_lag, lv) for lv in self.levels]

    @property
    def has_lags(self) -> bool:
        """Whether any edge has a non-zero lag."""
        return self.pred_lag is not None

    def with_edge_lag(self, edge_lag_s: np.ndarray | Sequence[float] | None) -> SolverProblem:
        """The same problem with other edge lags (one per edge of `edges`; ``None``: zero).

        Shares every other array with this problem (cheap: no DAG layout again).
        """
        other = object.__new__(SolverProblem)
        other.__dict__.update(self.__dict__)
        other._set_lags(None if edge_lag_s is None else np.asarray(edge_lag_s, dtype=float))
        return other

    @property
    def hulls(self) -> list[CostHull]:
        """Per type, the convex effective-cost hull (`effective_cost_hull`), built on first use
        (scoring plans never needs them)."""
        if self._hulls is None:
            self._hulls = [
                effective_cost_hull(o.time_s, o.energy_j, self.p2p_power_w)
                for o in self.type_options
            ]
        return self._hulls

    # ------------------------------------------------------------------ building
    @classmethod
    def build(
        cls,
        *,
        edges: np.ndarray | Sequence[tuple[int, int]],
        type_of: np.ndarray | Sequence[int],
        options: Sequence[OptionTable],
        resources: Sequence[np.ndarray | Sequence[int]],
        p2p_power_w: float,
        lead_ramp: np.ndarray | None = None,
        edge_lag_s: np.ndarray | Sequence[float] | None = None,
    ) -> SolverProblem:
        """Validate the inputs and lay out the arrays.

        Args:
            edges: ``(u, v)`` node pairs, every one with ``u < v`` (nodes are numbered in a
                topological order).
            type_of: Each node's option type (an index into `options`).
            options: Per type, its options (at least one each).
            resources: Per resource, the nodes it runs (``S = len(resources)``).
            p2p_power_w: Power (W) a resource draws while not running a node.
            lead_ramp: Per node, the fraction (0..1) of the staggered dithering's lead it
                gets (`perseus.solver.frontier.staggered_lead`); default 1 everywhere.
            edge_lag_s: Per edge of `edges` (same order), the lag (s, finite, >= 0): ``v``
                starts no earlier than ``finish(u) + lag``. Default: all zero.
        """
        if not np.isfinite(p2p_power_w) or p2p_power_w < 0:
            raise SolverError(
                f"The blocking (P2P) power must be a finite number of watts >= 0, got {p2p_power_w!r}"
            )
        type_of = np.asarray(type_of, dtype=np.int64)
        n = len(type_of)
        if n == 0:
            raise SolverError("The problem has no nodes to plan")
        type_options = list(options)
        if any(len(o) == 0 for o in type_options) or not (
            type_of.min() >= 0 and type_of.max() < len(type_options)
        ):
            raise SolverError("Every node needs an option type with at least one option")
        edges = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
        if len(edges) and not (
            (edges >= 0).all() and (edges < n).all() and (edges[:, 0] < edges[:, 1]).all()
        ):
            raise SolverError("Edges must join nodes 0..n-1 numbered in a topological order")
        preds = padded_adjacency(n, edges[:, 1], edges[:, 0], fill=n)
        succs = padded_adjacency(n, edges[:, 0], edges[:, 1], fill=n)

        level = np.zeros(n, dtype=np.int64)
        for k in range(n):  # topological order: predecessors already have their level
            p = preds[k]
            p = p[p < n]
            if len(p):
                level[k] = level[p].max() + 1
        order = np.argsort(level, kind="stable")
        bounds = np.searchsorted(level[order], np.arange(level.max() + 2))
        levels = [order[bounds[i] : bounds[i + 1]] for i in range(len(bounds) - 1)]
        ramp = np.ones(n) if lead_ramp is None else np.asarray(lead_ramp, dtype=float)
        return cls(
            p2p_power_w=p2p_power_w,
            type_options=type_options,
            type_of=type_of,
            preds=preds,
            succs=succs,
            edges=edges,
            levels=levels,
            level_of=level,
            resources=[np.asarray(r, dtype=np.int64) for r in resources],
            lead_ramp=ramp,
            edge_lag_s=None if edge_lag_s is None else np.asarray(edge_lag_s, dtype=float),
        )

    # ------------------------------------------------------------------ accounting
    def start_finish(
        self, durations: np.ndarray, *, out: tuple[np.ndarray, np.ndarray] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Earliest (start, finish) times for durations of shape ``(n,)`` or ``(n, K)``.

        `out`: arrays of shapes ``(n, K)`` and ``(n + 1, K)`` to fill instead of new ones
        (the rounding reuses them: fresh 16 MB arrays cost a page fault per 4 KB).
        """
        d = np.asarray(durations, dtype=float)
        if out is None:
            start = np.empty(d.shape)
            finish = np.empty((self.n + 1, *d.shape[1:]))
        else:
            start, finish = out
        finish[self.n] = 0.0  # row n: the "no predecessor" zero; every level fills the rest
        for lv, pred, lag in zip(
            self.level_rows, self.level_preds, self.level_pred_lags, strict=True
        ):
            s = latest_of(finish, pred, lag)  # a new array
            start[lv] = s
            s += d[lv]
            finish[lv] = s
        return start, finish[: self.n]

    def finish_times(self, durations: np.ndarray) -> np.ndarray:
        """Earliest finish times for durations of shape ``(n,)`` or ``(n, K)``."""
        return self.start_finish(durations)[1]

    def makespan(self, durations: np.ndarray) -> np.ndarray | float:
        """Longest path (iteration time) for one or many duration vectors."""
        return self.finish_times(durations).max(axis=0)

    def latest_starts(self, durations: np.ndarray, deadline_s: np.ndarray | float) -> np.ndarray:
        """Latest start times that keep every path within `deadline_s` (per column)."""
        d = np.asarray(durations, dtype=float)
        ls = np.empty((self.n + 1, *d.shape[1:]))
        ls[self.n] = deadline_s
        for lv, succ, lag in zip(
            reversed(self.level_rows),
            reversed(self.level_succs),
            reversed(self.level_succ_lags),
            strict=True,
        ):
            ls[lv] = earliest_of(ls, succ, lag) - d[lv]
        return ls[: self.n]

    def latest_start_finish(
        self, durations: np.ndarray, deadline_s: np.ndarray | float
    ) -> tuple[np.ndarray, np.ndarray]:
        """Latest (start, finish) times that keep every path within `deadline_s`.

        A node's latest finish is the earliest latest start of its successors, each less
        its edge's lag (or the deadline); its latest start is that minus its duration.
        """
        d = np.asarray(durations, dtype=float)
        ls = np.empty((self.n + 1, *d.shape[1:]))
        lf = np.empty(d.shape)
        ls[self.n] = deadline_s
        for lv, succ, lag in zip(
            reversed(self.level_rows),
            reversed(self.level_succs),
            reversed(self.level_succ_lags),
            strict=True,
        ):
            lf[lv] = earliest_of(ls, succ, lag)
            ls[lv] = lf[lv] - d[lv]
        return ls[: self.n], lf

    def choices_to_arrays(self, choice: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(time_s, energy_j) of option indices `choice` (shape ``(n,)`` or ``(n, K)``)."""
        t_idx = self.type_of if choice.ndim == 1 else self.type_of[:, None]
        return self.opt_time[t_idx, choice], self.opt_energy[t_idx, choice]

    def account(self, choice: np.ndarray, *, exact: bool = True) -> Accounting:
        """The accounting of plans `choice` ``(n, K)`` (option indices), per plan.

        Earliest starts (edge lags included), ``T`` = latest finish, compute time ``Σ (finish − start)``,
        blocking energy ``P·(S·T − Σ tᵢ)``, energy = compute energy + blocking energy. With
        `exact`, the sums run one node at a time in topological order (``0 + x₀ + x₁ +
        …``), so the numbers do not depend on how many plans are scored together;
        otherwise numpy may sum pairwise (faster; equal to ~1e-15 relative), which is
        enough to rank candidates.
        """
        time_s, energy_j = self.choices_to_arrays(choice)
        start, finish = self.start_finish(time_s)
        T = finish.max(axis=0)
        busy = finish - start
        if exact:
            compute_e = np.cumsum(energy_j, axis=0)[-1]
            compute_t = np.cumsum(busy, axis=0)[-1]
        else:
            compute_e = energy_j.sum(axis=0)
            compute_t = busy.sum(axis=0)
        blocking = self.p2p_power_w * (self.num_resources * T - compute_t)
        return Accounting(T, compute_e + blocking, compute_e, blocking)

    def score(
        self, choice: np.ndarray, *, exact: bool = True
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(iteration_time_s, energy_j, compute_energy_j) of plans ``(n, K)`` (`account`)."""
        T, E, C, _ = self.account(choice, exact=exact)
        return T, E, C

    def choices_to_labels(self, choice: np.ndarray) -> np.ndarray:
        """Labels of option indices `choice` (shape ``(n,)`` or ``(n, K)``)."""
        t_idx = self.type_of if choice.ndim == 1 else self.type_of[:, None]
        return self.opt_label[t_idx, choice]

    def reference_choice(self) -> np.ndarray:
        """Option index of every node's reference option (its largest label)."""
        best = np.array([int(np.argmax(o.label)) for o in self.type_options], dtype=np.int64)
        return best[self.type_of]

    def fastest_choice(self) -> np.ndarray:
        """Option index of every node's fastest option (least energy among equally fast
        ones), whatever its label: its plan's time is the minimum iteration time."""
        best = np.array(
            [int(np.lexsort((o.energy_j, o.time_s))[0]) for o in self.type_options],
            dtype=np.int64,
        )
        return best[self.type_of]
