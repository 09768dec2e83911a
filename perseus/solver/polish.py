"""Exact polish of one plan: re-choose windows of it with a small MILP, at the same time.

The frontier's plans round LP solutions one instruction at a time. Where every stage is
pinned to its neighbours (the 1F1B steady state behind a critical last stage), the best
discrete plans change several stages together, and rounding leaves up to ~0.4 % of energy
that coordinated choices recover (`benchmarks/README.md`). Finding them for a whole
frontier is far too slow, but for the one plan a user deploys it is minutes well spent.

`polish_plan` sweeps a time window over the plan's schedule. Inside a window (every
instruction whose current start falls in it) it picks every instruction's option exactly (a
mixed-integer program solved by scipy's HiGHS) with everything outside held: a window
instruction starts after its fixed predecessors finish (plus the edge's lag) and finishes
before its fixed successors' latest starts (less the lag) and the plan's iteration time
``T``; inside the window, ``s_v ≥ s_u + t_u + lag(u, v)``. An edge always goes to a later
start, so no path leaves a window and comes back into it. With ``T`` held, the
window's objective ``Σ (e − P_block·t)`` is exactly the plan's energy change; the last
window may also shorten ``T``, at ``P_block·S`` joules per second. A window's
result is kept only when the exact score (`SolverProblem.score`) confirms lower energy at
no longer iteration time, so polishing never makes a plan worse.

Windows are cut by start time rather than by instruction count: a window then holds the
same few cycles of every busy stage, and fewer instructions in the warm-up and drain, where
few stages run. At the worst frontier points of the reference profile this recovers more
than count-cut windows of the same average size (`benchmarks/README.md`).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from perseus.errors import SolverError
from perseus.solver.problem import SolverProblem
from perseus.solver.rounding import Rounder

__all__ = ["PolishResult", "polish_plan"]

_WINDOW_DURATIONS = 7.5
"""Default window width, in mean instruction durations of the plan being polished."""


@dataclass(frozen=True)
class PolishResult:
    """A polished plan and what the polish did."""

    choice: np.ndarray
    """Option index of every instruction (`SolverProblem` numbering)."""
    iteration_time_s: float
    energy_j: float
    initial_iteration_time_s: float
    initial_energy_j: float
    windows: int
    """Windows solved."""
    improved_windows: int
    """Windows whose new choices were kept."""
    complete: bool
    """False when the time budget stopped the polish before the last window of its last
    pass."""


def polish_plan(
    problem: SolverProblem,
    choice: np.ndarray,
    *,
    window_s: float | None = None,
    window_time_limit_s: float = 5.0,
    passes: int = 2,
    budget_s: float | None = None,
    progress: Callable[[float], None] | None = None,
) -> PolishResult:
    """Lower the energy of one plan without lengthening its iteration.

    `choice` is the plan's option index per instruction. `window_s` is the width of the
    time window whose instructions are re-chosen together (default: 7.5 mean instruction
    durations of the plan, about four 1F1B cycles of every stage); consecutive windows
    overlap by two thirds. `window_time_limit_s` caps one window's MILP (its best plan so
    far is used when the limit hits). `passes` sweeps run one after the other, each with
    its windows shifted by a fraction of the stride. `budget_s` caps the whole polish.
    `progress` gets the fraction of the sweeps done.
    """
    choice = np.array(choice, dtype=np.int64)
    if choice.shape != (problem.n,):
        raise SolverError(f"A plan needs one option per node ({problem.n}), got {choice.shape}")
    if np.any(choice < 0) or np.any(choice >= problem.opt_count[problem.type_of]):
        raise SolverError("The plan chooses an option index the profile does not have")
    if window_s is None:
        window_s = _WINDOW_DURATIONS * float(problem.choices_to_arrays(choice)[0].mean())
    if not (math.isfinite(window_s) and window_s > 0):
        raise SolverError(f"The polish window must be a positive number of seconds, got {window_s}")
    if not (math.isfinite(window_time_limit_s) and window_time_limit_s > 0):
        raise SolverError(
            f"The window time limit must be a positive number of seconds, got {window_time_limit_s}"
        )
    if budget_s is not None and not (math.isfinite(budget_s) and budget_s >= 0):
        raise SolverError(
            f"The polish budget must be a number of seconds >= 0 (or none), got {budget_s}"
        )
    if passes < 1:
        raise SolverError(f"The polish needs at least one pass, got {passes}")
    rounder = Rounder(problem)
    useful = [rounder.staircase(k) for k in range(len(problem.type_options))]  # can pay
    t0 = time.perf_counter()

    T0, E0, _ = (float(x[0]) for x in problem.score(choice[:, None]))
    T_cur, E_cur = T0, E0
    stride = window_s / 3
    count = max(1, math.ceil(T0 / stride))
    done = improved = 0
    complete = False

    def schedule(choice: np.ndarray, T: float) -> tuple[np.ndarray, ...]:
        durations, _ = problem.choices_to_arrays(choice)
        start, finish = problem.start_finish(durations)
        return start, finish, problem.latest_starts(durations, T)

    # The plan's schedule changes only when a window's result is kept.
    start, finish, latest = schedule(choice, T_cur)
    for sweep in range(passes):
        # Later sweeps shift the windows by a fraction of the stride, so instructions cut
        # apart at one sweep's window edges are re-chosen together in the next.
        lows = stride * (np.arange(-1 if sweep else 0, count) + sweep / passes)
        complete = False
        for k, lo in enumerate(lows):
            if budget_s is not None and time.perf_counter() - t0 > budget_s:
                break
            members = np.flatnonzero((start >= lo) & (start < lo + window_s))
            tail = bool(start.max() < lo + window_s)  # nothing after it: may shorten T too
            if len(members):
                limit = window_time_limit_s
                if budget_s is not None:
                    limit = max(0.1, min(limit, budget_s - (time.perf_counter() - t0)))
                new = _solve_window(
                    problem, choice, members, useful, finish, latest, T_cur, tail, limit
                )
                done += 1
                if new is not None:
                    T_new, E_new, _ = (float(x[0]) for x in problem.score(new[:, None]))
                    if T_new <= T_cur and E_new < E_cur - 1e-9:
                        choice, T_cur, E_cur = new, T_new, E_new
                        start, finish, latest = schedule(choice, T_cur)
                        improved += 1
            complete = tail
            if progress is not None:
                progress((sweep + (1.0 if tail else (k + 1) / len(lows))) / passes)
            if tail:  # every later window of this sweep would be empty
                break
        if not complete:
            break
    return PolishResult(
        choice=choice,
        iteration_time_s=T_cur,
        energy_j=E_cur,
        initial_iteration_time_s=T0,
        initial_energy_j=E0,
        windows=done,
        improved_windows=improved,
        complete=complete,
    )


def _solve_window(
    problem: SolverProblem,
    choice: np.ndarray,
    members: np.ndarray,
    useful: list[np.ndarray],
    finish: np.ndarray,
    latest: np.ndarray,
    deadline_s: float,
    tail: bool,
    time_limit_s: float,
) -> np.ndarray | None:
    """Best options for `members` with every other instruction held; None if no result.

    A `tail` window (no instruction after it) also chooses the iteration time ``T ≤
    deadline_s`` at its price ``P_block·S`` per second; any other window keeps ``T``.
    """
    n_w = len(members)
    pos = np.full(problem.n, -1, dtype=np.int64)
    pos[members] = np.arange(n_w)
    opts = [useful[problem.type_of[i]] for i in members]
    xoff = np.concatenate([[0], np.cumsum([len(o) for o in opts])])
    nx = int(xoff[-1])
    types = problem.type_of[members]
    dur = np.concatenate([problem.opt_time[ty, o] for ty, o in zip(types, opts, strict=True)])
    energy = np.concatenate([problem.opt_energy[ty, o] for ty, o in zip(types, opts, strict=True)])
    cost = energy - problem.p2p_power_w * dur
    owner = np.repeat(np.arange(n_w), np.diff(xoff))
    # Variables: option binaries x (nx), start times s (n_w), the iteration time T.
    s_lo = np.zeros(n_w)
    s_hi = np.full(n_w, deadline_s)
    finish_hi = np.full(n_w, np.inf)  # s + Σ t·x ≤ this (fixed successors' latest starts)
    u, v = problem.edges[:, 0], problem.edges[:, 1]
    lag = problem.edge_lag_s
    pu, pv = pos[u], pos[v]
    into = (pu < 0) & (pv >= 0)  # fixed predecessor → window
    np.maximum.at(s_lo, pv[into], finish[u[into]] + lag[into])
    out = (pu >= 0) & (pv < 0)  # window → fixed successor
    np.minimum.at(finish_hi, pu[out], latest[v[out]] - lag[out])
    inner = (pu >= 0) & (pv >= 0)
    iu, iv = pu[inner], pv[inner]
    rows, cols, vals = [], [], []
    # exactly one option per instruction
    rows.append(owner)
    cols.append(np.arange(nx))
    vals.append(np.ones(nx))
    r = n_w
    # inner edges: s_v − s_u − Σ t·x_u ≥ lag(u, v)
    m = len(iu)
    er = r + np.arange(m)
    rows += [er, er]
    cols += [nx + iv, nx + iu]
    vals += [np.ones(m), -np.ones(m)]
    for e, a in enumerate(iu):
        sl = slice(xoff[a], xoff[a + 1])
        rows.append(np.full(sl.stop - sl.start, r + e))
        cols.append(np.arange(sl.start, sl.stop))
        vals.append(-dur[sl])
    r += m
    # finish bounds: s_a + Σ t·x_a ≤ finish_hi[a], and s_a + Σ t·x_a − T ≤ 0
    for k in range(2):
        rows += [r + k * n_w + np.arange(n_w), r + k * n_w + owner]
        cols += [nx + np.arange(n_w), np.arange(nx)]
        vals += [np.ones(n_w), dur]
    rows.append(r + n_w + np.arange(n_w))
    cols.append(np.full(n_w, nx + n_w))
    vals.append(-np.ones(n_w))
    nrows = r + 2 * n_w
    a_mat = coo_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
        shape=(nrows, nx + n_w + 1),
    ).tocsr()
    lo = np.concatenate([np.ones(n_w), lag[inner], np.full(2 * n_w, -np.inf)])
    hi = np.concatenate([np.ones(n_w), np.full(m, np.inf), finish_hi, np.zeros(n_w)])
    outside = pos < 0
    floor = float(finish[outside].max()) if tail and outside.any() else 0.0
    T_lo = floor if tail else deadline_s
    T_cost = problem.p2p_power_w * problem.num_resources if tail else 0.0
    with native_stdout_silenced():
        res = milp(
            np.concatenate([cost, np.zeros(n_w), [T_cost]]),
            constraints=LinearConstraint(a_mat, lo, hi),
            integrality=np.concatenate([np.ones(nx), np.zeros(n_w + 1)]),
            bounds=Bounds(
                np.concatenate([np.zeros(nx), s_lo, [T_lo]]),
                np.concatenate([np.ones(nx), s_hi, [deadline_s]]),
            ),
            options={"time_limit": time_limit_s, "mip_rel_gap": 1e-6},
        )
    if res.x is None:
        return None
    new = choice.copy()
    picked = res.x[:nx]
    for a, i in enumerate(members):
        new[i] = opts[a][int(np.argmax(picked[xoff[a] : xoff[a + 1]]))]
    return new


@contextlib.contextmanager
def native_stdout_silenced() -> Iterator[None]:
    """Send file descriptor 1 to /dev/null for a moment.

    HiGHS (inside scipy) prints a stray debug line from C++ now and then when a time limit
    hits, which would land in the middle of the CLI's output; `disp=False` does not stop it.
    """
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # no real stdout (pytest capture, notebooks)
        yield
        return
    sys.stdout.flush()
    saved = os.dup(fd)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), fd)
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)
