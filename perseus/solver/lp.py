"""The exact parametric LP: minimum effective energy for every iteration-time bound T.

Problem (for a fixed deadline ``T``)::

    minimise   Σᵢ cᵢ(dᵢ)                   cᵢ convex, piecewise linear, non-increasing
    subject to every DAG path has Σ dᵢ + Σ lags ≤ T,  dᵢ ≥ aᵢ  (the fastest time)

with ``cᵢ`` the lower convex hull of the instruction's ``(t, e − P_block·t)`` options
(`perseus.solver.hull.effective_cost_hull`). This is Fulkerson's (1961) project
time/cost trade-off with convex piecewise-linear costs. Its optimum ``F(T)`` is convex
and piecewise linear in ``T``; the energy lower bound is ``F(T) + P_block·S·T``.

Algorithm: the LP dual is a maximum-*length* flow problem. Split every instruction into a
start node and a finish node joined by parallel arcs, one per hull vertex ``τⱼ``, of
length ``τⱼ`` and capacity equal to the increase in slope there (the fastest vertex's arc
has infinite capacity); precedence arcs have infinite capacity and the edge's lag as their
length (0 without lags; a lag is a fixed delay no price can shorten). Sending ``v``
units of flow is the dual of "shorten the iteration at marginal price ``v``". Successive
longest augmenting paths (primal–dual, like Phillips–Dessouky's cuts) then trace the
whole curve from the slowest end ``T_max`` (every instruction at its cheapest vertex):

1. potentials ``π`` = longest distances from the source in the residual network, found
   with Dijkstra on reduced lengths (never negative thanks to the previous potentials);
   ``λ = π(sink)`` is the current breakpoint of ``F`` and ``dᵢ = π(finishᵢ) − π(startᵢ)``
   is an optimal LP solution at ``T = λ`` (complementary slackness);
2. stop if an all-infinite-capacity path is tight: ``λ`` is the minimum time ``T_min``;
3. otherwise push a maximum flow through the tight arcs (one max-flow, Dinic); this
   saturates a minimum cut, so the next ``λ`` is strictly smaller. Each phase is one
   breakpoint of ``F`` — the step goes straight to the next event, never a fixed quantum.

Between consecutive breakpoints the optimal durations are the linear interpolation of the
two breakpoint solutions (``F`` is linear there and the costs are convex).

Dense hulls (more than 16 vertices: smooth, model-made profiles such as the emulator's or
``profile synth``'s, where almost every clock is on the hull) cost the sweep one phase per
vertex event and hardly change the optimum between neighbouring vertices. For the sweep
their runs of segments whose slopes are within 8 % of each other are merged into one
(the chord between two real options). A chord lies above the hull, so the swept optimum
``F̃ ≥ F`` exceeds it by at most ``Σᵢ δᵢ`` (``δᵢ``: the chord's largest excess over
instruction i's hull); the curve reports ``F̃ − Σᵢ δᵢ``, still a true lower bound. Real
measured profiles keep every vertex (theirs have 8-9), and their curve is exact.

Flows are exact integers in a unit of ``Σ slopes / 2³⁰`` watts (capacities are the hull
slopes rounded to that unit, which perturbs the LP by less than one part in 10⁸ of the
largest total slope); lengths, potentials and costs stay in float seconds/joules, and
``F`` at each breakpoint is evaluated from the durations with the true hull costs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import dijkstra, maximum_flow

from perseus.errors import SolverError
from perseus.solver.hull import CostHull
from perseus.solver.problem import SolverProblem

__all__ = ["LPCurve", "solve_lp_curve"]

_INF_CAP = np.int64(2**31 - 1)  # scipy's max-flow capacities are int32
_FLOW_BUDGET = 2**30
_DENSE_HULL = 16
"""Hulls with more vertices than this are coarsened for the sweep (module docstring)."""
_MERGE_RATIO = 1.08
"""Neighbouring segments of a dense hull whose slopes are within this ratio are merged."""


@dataclass(frozen=True)
class LPCurve:
    """Breakpoints of the LP optimum ``F(T)``, sorted by increasing time.

    ``cost_j[k] = F(time_s[k])``, the minimum effective cost ``Σ cᵢ(dᵢ)`` for iteration
    time ≤ ``time_s[k]``; ``F`` is linear between breakpoints and constant after the last.
    """

    time_s: np.ndarray
    cost_j: np.ndarray
    num_resources: int
    p2p_power_w: float

    def effective_cost(self, deadline_s: np.ndarray | float) -> np.ndarray:
        """``F(T)`` (for ``T`` below the first breakpoint this is ``F(T_min)``: no plan exists)."""
        return np.interp(deadline_s, self.time_s, self.cost_j)

    def energy(self, deadline_s: np.ndarray | float) -> np.ndarray:
        """``F(T) + P·S·T``: the LP energy of running with iteration time exactly ``T``."""
        T = np.asarray(deadline_s, dtype=float)
        return self.effective_cost(T) + self.p2p_power_w * self.num_resources * T

    def lower_bound(self, deadline_s: np.ndarray | float) -> np.ndarray:
        """Lower bound on the energy of any plan whose iteration time is ≤ `deadline_s`.

        ``min over T' ≤ T of F(T') + P·S·T'``; convex in ``T'``, so the minimum is at ``T``
        or at the best breakpoint below it.
        """
        energy = self.cost_j + self.p2p_power_w * self.num_resources * self.time_s
        best_so_far = np.minimum.accumulate(energy)
        T = np.asarray(deadline_s, dtype=float)
        k = np.clip(np.searchsorted(self.time_s, T, side="right") - 1, 0, len(self.time_s) - 1)
        return np.minimum(self.energy(T), best_so_far[k])


def sweep_hulls(hulls: list[CostHull]) -> tuple[list[CostHull], np.ndarray]:
    """The hulls the sweep runs on, and per hull its largest excess (J) over the true one.

    A hull with at most `_DENSE_HULL` vertices is kept as it is (excess 0). A denser one
    keeps its first and last vertex and, from the fast end, every vertex where the slope
    has fallen by more than `_MERGE_RATIO` since the last kept one: only real options, and
    a chord between two vertices of a convex function lies on or above it.
    """
    out: list[CostHull] = []
    excess = np.zeros(len(hulls))
    for k, h in enumerate(hulls):
        if len(h.time_s) <= _DENSE_HULL:
            out.append(h)
            continue
        slopes = h.slopes_w
        keep = [0]
        j = 0
        while j < len(slopes):
            end = j
            while end + 1 < len(slopes) and slopes[j] <= _MERGE_RATIO * slopes[end + 1]:
                end += 1
            keep.append(end + 1)
            j = end + 1
        idx = np.array(keep)
        coarse = CostHull(time_s=h.time_s[idx].copy(), cost_j=h.cost_j[idx].copy())
        excess[k] = max(float((coarse(h.time_s) - h.cost_j).max()), 0.0)
        out.append(coarse)
    return out, excess


class _TypeTables:
    """Per-type hull vertices and integer slopes, padded for vectorised lookups."""

    def __init__(self, hulls: list[CostHull], type_of: np.ndarray):
        counts = np.bincount(type_of, minlength=len(hulls))
        total = sum(
            float(h.slopes_w[0]) * int(c)
            for h, c in zip(hulls, counts, strict=True)
            if len(h.slopes_w)
        )
        self.unit_w = max(total, 1e-300) / _FLOW_BUDGET
        sig_list, tau_list = [], []
        for h in hulls:
            tau, sig = h.time_s, h.slopes_w
            units = np.maximum(np.rint(sig / self.unit_w), 1).astype(np.int64)
            # Rounding may tie neighbouring slopes: drop the vertex between equal slopes.
            keep_tau = [0]
            keep_sig: list[int] = []
            for j, u in enumerate(units):
                if keep_sig and keep_sig[-1] <= u:
                    keep_tau[-1] = j + 1  # merge: the vertex between them disappears
                    continue
                keep_sig.append(int(u))
                keep_tau.append(j + 1)
            sig_list.append(np.array(keep_sig, dtype=np.int64))
            tau_list.append(tau[keep_tau])
        kmax = max(len(s) for s in sig_list)
        self.sig = np.full((len(hulls), max(kmax, 1)), -1, dtype=np.int64)
        self.tau = np.zeros((len(hulls), kmax + 1))
        self.nseg = np.array([len(s) for s in sig_list], dtype=np.int64)
        for k, (s, t) in enumerate(zip(sig_list, tau_list, strict=True)):
            self.sig[k, : len(s)] = s
            self.tau[k, : len(t)] = t
            self.tau[k, len(t) :] = t[-1]


BreakpointCallback = Callable[[float, float, np.ndarray], bool | None]


def solve_lp_curve(
    problem: SolverProblem,
    *,
    on_breakpoint: BreakpointCallback | None = None,
    progress: Callable[[float], None] | None = None,
) -> LPCurve:
    """Trace every breakpoint of the LP optimum ``F(T)`` (see the module docstring).

    Breakpoints are produced from the slowest (``T_max``) to the fastest (``T_min``);
    `on_breakpoint(T, F, durations)` is called with each one, ``F(T)`` and an optimal
    duration vector there (do not modify it; copy it to keep it). A truthy return value
    stops the sweep there (the curve then starts at that breakpoint).
    """
    n = problem.n
    hulls, excess = sweep_hulls(problem.hulls)
    # F̃ − offset is a true lower bound (0 when no hull was coarsened: the exact F).
    offset = float(excess[problem.type_of].sum())
    tables = _TypeTables(hulls, problem.type_of)
    sig = tables.sig[problem.type_of]  # (n, kmax), descending, padded with -1
    tau = tables.tau[problem.type_of]  # (n, kmax+1)
    nseg = tables.nseg[problem.type_of]
    rows = np.arange(n)
    a = tau[:, 0]
    b = tau[rows, nseg]
    hull_t, hull_c = _hull_tables(hulls)

    # Node numbering: 0 source, 1 sink, 2+2i start of i, 3+2i finish of i.
    V = 2 + 2 * n
    start, finish = 2 + 2 * rows, 3 + 2 * rows
    e = problem.edges
    has_pred = np.zeros(n, dtype=bool)
    has_succ = np.zeros(n, dtype=bool)
    has_pred[e[:, 1]] = True
    has_succ[e[:, 0]] = True
    src = np.flatnonzero(~has_pred)
    snk = np.flatnonzero(~has_succ)
    # Arcs: n activity arcs, then infinite-capacity arcs: precedence (length = the edge's
    # lag), source and sink (length 0).
    au = np.concatenate([start, finish[e[:, 0]], np.zeros(len(src), dtype=np.int64), finish[snk]])
    av = np.concatenate([finish, start[e[:, 1]], start[src], np.ones(len(snk), dtype=np.int64)])
    A = len(au)
    # A fixed CSR holding every arc in both directions; per phase only the data changes.
    er = np.concatenate([au, av])
    ec = np.concatenate([av, au])
    order = np.lexsort((ec, er))
    indices = ec[order].astype(np.int32)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(er, minlength=V))]).astype(np.int32)
    pos = np.empty(2 * A, dtype=np.int64)
    pos[order] = np.arange(2 * A)
    pos_f, pos_b = pos[:A], pos[A:]
    row_of = er[order]
    col_of = ec[order]

    # The two residual networks of every phase share this arc layout; building the sparse
    # matrices once and swapping their data skips scipy's format checks, phase after phase.
    graph = sp.csr_matrix((np.zeros(2 * A), indices, indptr), shape=(V, V))
    capacities = sp.csr_matrix((np.zeros(2 * A, dtype=np.int32), indices, indptr), shape=(V, V))
    flow = np.zeros(A, dtype=np.int64)
    length = np.zeros(2 * A)
    cap = np.zeros(2 * A, dtype=np.int64)
    cap[pos_f[n:]] = _INF_CAP  # other arcs: infinite forward capacity
    if problem.has_lags:  # a backward residual arc has minus its forward arc's length
        length[pos_f[n : n + len(e)]] = problem.edge_lag_s
        length[pos_b[n : n + len(e)]] = -problem.edge_lag_s

    # Initial potentials: earliest times (lags included) with every instruction at its
    # slowest vertex.
    fin = problem.finish_times(b)
    pi = np.empty(V)
    pi[finish] = fin
    pi[start] = fin - b
    pi[0] = 0.0
    pi[1] = fin.max()
    t_max = float(pi[1])
    t_min = float(problem.makespan(a))
    span = max(t_max - t_min, 1e-300)
    tol = 1e-11 * max(t_max, 1.0)

    times: list[float] = []
    costs: list[float] = []
    d_prev = b.copy()
    # Each instruction's hull cost at `d_prev`: a phase re-evaluates only the changed ones.
    cost_prev = _hull_cost(hull_t, hull_c, problem.type_of, rows, b)
    f_prev = float(cost_prev.sum())
    limit = span / 64
    last_seg = sig.shape[1] - 1

    def update_activity(idx: np.ndarray) -> None:
        """Residual lengths and capacities of the activity arcs `idx` (those whose flow
        changed: a phase moves the flow of a cut's worth of arcs, not of all of them)."""
        fa = flow[idx]
        sg = sig[idx]
        r = np.arange(len(idx))
        above = (sg > fa[:, None]).sum(axis=1)  # segment of the forward residual arc
        at_or_above = (sg >= fa[:, None]).sum(axis=1)  # segment of the backward one
        length[pos_f[idx]] = tau[idx, above]
        cap[pos_f[idx]] = np.where(above > 0, sg[r, np.maximum(above - 1, 0)] - fa, _INF_CAP)
        length[pos_b[idx]] = -tau[idx, at_or_above]
        lower = np.where(at_or_above < nseg[idx], sg[r, np.minimum(at_or_above, last_seg)], 0)
        cap[pos_b[idx]] = np.where(fa > 0, fa - lower, 0)

    def reduced(at: np.ndarray | slice) -> np.ndarray:
        """Reduced lengths ``π(v) − π(u) − length`` of the arcs `at`."""
        out = pi[col_of[at]] - pi[row_of[at]]
        out -= length[at]
        return out

    update_activity(rows)
    red = reduced(slice(None))
    while True:
        # ---- longest paths via Dijkstra on reduced lengths (arcs without capacity: ∞)
        has_cap = cap > 0
        graph.data = np.where(has_cap, np.maximum(red, 0.0), np.inf)
        while True:
            dist = dijkstra(graph, directed=True, indices=0, limit=limit)
            if np.isfinite(dist[1]):
                break
            limit *= 4
        drop = float(dist[1])
        limit = max(2 * drop, span * 1e-9)
        pi = pi - np.minimum(dist, drop)

        # ---- record the breakpoint: λ = π(sink), durations from the potentials
        lam = float(pi[1])
        d = np.clip(pi[finish] - pi[start], a, b)
        changed = np.flatnonzero(d != d_prev)
        if len(changed):
            cost = _hull_cost(hull_t, hull_c, problem.type_of, changed, d[changed])
            f_prev += float((cost - cost_prev[changed]).sum())
            cost_prev[changed] = cost
            d_prev = d
        if times and times[-1] - lam <= tol:
            times[-1], costs[-1] = lam, f_prev - offset
        else:
            times.append(lam)
            costs.append(f_prev - offset)
        if on_breakpoint is not None and on_breakpoint(lam, f_prev - offset, d):
            break
        if progress is not None:
            progress(min(1.0, (t_max - lam) / span))

        # ---- push a maximum flow through the tight arcs
        red = reduced(slice(None))
        tight = (red <= tol) & has_cap
        capacities.data = np.where(tight, np.minimum(cap, _INF_CAP), 0).astype(np.int32)
        result = maximum_flow(capacities, 0, 1)
        if result.flow_value >= _INF_CAP:
            break  # a tight path of infinite capacity: λ is the minimum time T_min
        if result.flow_value <= 0:  # pragma: no cover - the longest path is tight
            raise SolverError("Internal error in the LP solver: no flow through the tight arcs")
        delta = result.flow.data[pos_f]
        moved = np.flatnonzero(delta)
        flow[moved] += delta[moved]
        if (flow[moved] < 0).any():  # pragma: no cover
            raise SolverError("Internal error in the LP solver: negative flow")
        activity = moved[moved < n]
        update_activity(activity)
        other = moved[moved >= n]
        cap[pos_b[other]] = flow[other]
        # Only the moved activity arcs changed length: the next phase's reduced lengths
        # are these, updated there (the potentials stay until its Dijkstra).
        touched = np.concatenate([pos_f[activity], pos_b[activity]])
        red[touched] = reduced(touched)

    return LPCurve(
        time_s=np.array(times[::-1]),
        cost_j=np.array(costs[::-1]),
        num_resources=problem.num_resources,
        p2p_power_w=problem.p2p_power_w,
    )


def _hull_tables(hulls: list[CostHull]) -> tuple[np.ndarray, np.ndarray]:
    """Per-type hull vertices padded to one width (times padded with +inf)."""
    width = max(len(h.time_s) for h in hulls)
    ht = np.full((len(hulls), width), np.inf)
    hc = np.zeros((len(hulls), width))
    for k, h in enumerate(hulls):
        ht[k, : len(h.time_s)] = h.time_s
        hc[k, : len(h.time_s)] = h.cost_j
        hc[k, len(h.time_s) :] = h.cost_j[-1]
    return ht, hc


def _hull_cost(
    ht: np.ndarray, hc: np.ndarray, type_of: np.ndarray, idx: np.ndarray, d: np.ndarray
) -> np.ndarray:
    """Hull cost of instructions `idx` at durations `d` (constant past the last vertex)."""
    t = ht[type_of[idx]]
    c = hc[type_of[idx]]
    k = np.clip((t <= d[:, None]).sum(axis=1) - 1, 0, t.shape[1] - 1)
    r = np.arange(len(idx))
    nxt = np.minimum(k + 1, t.shape[1] - 1)
    t0, t1, c0, c1 = t[r, k], t[r, nxt], c[r, k], c[r, nxt]
    with np.errstate(invalid="ignore"):
        w = np.where(np.isfinite(t1) & (t1 > t0), (d - t0) / (t1 - t0), 0.0)
    return c0 + np.clip(w, 0.0, 1.0) * (c1 - c0)
