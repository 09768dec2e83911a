"""What the steady state of 1F1B can reach at the fastest iteration time: a periodic MILP.

At the all-max iteration time the last stage ``S−1`` runs every instruction at maximum
frequency without a pause (true of the reference profile, whose last stage is the
slowest), so every other stage must keep its pace ``c`` = (forward +
backward of stage ``S−1`` at maximum frequency) and the LP runs their steady-state cycles
in lock-step at fractional durations. A discrete plan cannot, so it pays for the pace with
patterns that repeat over a few cycles. This script asks how cheap such patterns can be:

- it models the steady state as a *periodic* schedule of period ``p`` cycles: for every
  stage ``s < S−1`` and phase ``j < p`` the backward ``B_s(j)`` and the forward that follows
  it on its stage, one profiled option each (binaries) and a start time, with the 1F1B
  edges (same-stage order, ``B_{s+1}(j) → B_s(j)``, forward ``s → s+1`` one cycle later)
  wrapped around the period, stage ``S−1`` fixed at maximum frequency, and solves it with
  scipy's HiGHS (minimise ``Σ (e − P_block·t)`` per period);
- it prints, per cycle and stage-summed, the excess of the best periodic plan found (and the
  MILP's proven bound for that period) over the lock-step LP, next to the excess of our
  fastest frontier plan in its middle cycles, and the excess per cycle that 0.5 % above the
  LP bound leaves over the whole iteration.

    python benchmarks/cyclic_gap.py [--size 8x64] [--periods 1,2,3,4,5] [--time-limit 120]

It is an analysis of the integrality gap, not part of the solver: a period-``p`` plan only
covers the steady state (warm-up and drain are left out), and the MILP takes minutes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import lil_matrix

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_solver import DEFAULT_PROFILE, P_BLOCK_W, reference_frontier

from perseus.planning import PipelineProblem
from perseus.solver.hull import CostHull
from perseus.solver.polish import native_stdout_silenced
from perseus.solver.rounding import Rounder


def lockstep_pair(forward: CostHull, backward: CostHull, pace_s: float) -> float:
    """LP cost of one cycle: min ``forward(f) + backward(b)`` with ``f + b ≤ pace``.

    Both hulls are convex and piecewise linear, so the minimum lies where ``f`` or
    ``pace − f`` is a vertex.
    """
    f = np.concatenate([forward.time_s, pace_s - backward.time_s])
    f = f[(f >= forward.time_s[0]) & (pace_s - f >= backward.time_s[0])]
    if len(f) == 0:
        return float("inf")
    return float(np.min(forward(f) + backward(pace_s - f)))


def periodic_optimum(
    options: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]],
    num_stages: int,
    pace_s: float,
    period: int,
    time_limit_s: float,
) -> tuple[float, float, str, dict[tuple[int, str, int], float]]:
    """Best period-``period`` steady state of stages ``0..S−2`` at the last stage's pace.

    Returns (cost per period, proven bound per period, status, chosen duration per
    (stage, kind, phase)); kind ``"B"`` is ``B_s(j)``, ``"F"`` the forward after it.
    """
    keys = [(s, k, j) for s in range(num_stages - 1) for k in ("B", "F") for j in range(period)]
    start_col: dict[tuple[int, str, int], int] = {}
    opt_cols: dict[tuple[int, str, int], np.ndarray] = {}
    col = 0
    for key in keys:
        start_col[key] = col
        n = len(options[key[0], key[1]][0])
        opt_cols[key] = np.arange(col + 1, col + 1 + n)
        col += 1 + n
    c = np.zeros(col)
    integrality = np.zeros(col)
    lower, upper = np.zeros(col), np.ones(col)
    for key in keys:
        c[opt_cols[key]] = options[key[0], key[1]][1]
        integrality[opt_cols[key]] = 1
        lower[start_col[key]] = -pace_s * num_stages
        upper[start_col[key]] = pace_s * (period + num_stages)
    rows: list[dict[int, float]] = []
    lo: list[float] = []
    hi: list[float] = []

    def precedes(
        a: tuple[int, str, int] | float, b: tuple[int, str, int] | float, shift: float
    ) -> None:
        """end(a) ≤ start(b) + shift; a float `a` is a fixed end, a float `b` a fixed start."""
        row: dict[int, float] = {}
        rhs = shift
        if isinstance(a, tuple):
            row[start_col[a]] = 1.0
            for cc, t in zip(opt_cols[a], options[a[0], a[1]][0], strict=True):
                row[int(cc)] = float(t)
        else:
            rhs -= a
        if isinstance(b, tuple):
            row[start_col[b]] = row.get(start_col[b], 0.0) - 1.0
        else:
            rhs += b
        rows.append(row)
        lo.append(-np.inf)
        hi.append(rhs)

    for key in keys:  # one option each
        rows.append({int(cc): 1.0 for cc in opt_cols[key]})
        lo.append(1.0)
        hi.append(1.0)
    last = num_stages - 2  # the stage next to the pinned last stage
    wrap = period * pace_s
    for s in range(num_stages - 1):
        for j in range(period):
            # same stage: the forward of cycle j−1, then B_s(j), then its forward
            precedes((s, "F", (j - 1) % period), (s, "B", j), wrap if j == 0 else 0.0)
            precedes((s, "B", j), (s, "F", j), 0.0)
            # B_{s+1}(j) → B_s(j); the last stage's B(j) ends at j·pace
            precedes(j * pace_s if s == last else (s + 1, "B", j), (s, "B", j), 0.0)
            # the forward after B_s(j) feeds stage s+1's forward one cycle later; the last
            # stage's starts at (j+1)·pace
            nxt = (j + 1) * pace_s if s == last else (s + 1, "F", (j + 1) % period)
            precedes((s, "F", j), nxt, wrap if (s != last and j == period - 1) else 0.0)
    a = lil_matrix((len(rows), col))
    for r, row in enumerate(rows):
        for cc, v in row.items():
            a[r, cc] = v
    with native_stdout_silenced():  # HiGHS's stray debug line at a time limit
        res = milp(
            c,
            constraints=LinearConstraint(a.tocsr(), lo, hi),
            integrality=integrality,
            bounds=Bounds(lower, upper),
            options={"time_limit": time_limit_s, "mip_rel_gap": 1e-6},
        )
    bound = getattr(res, "mip_dual_bound", None)
    dual = float("nan") if bound is None else float(bound)
    if res.x is None:
        return float("nan"), dual, res.message, {}
    chosen = {key: float(res.x[opt_cols[key]] @ options[key[0], key[1]][0]) for key in keys}
    return float(res.fun), dual, res.message, chosen


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    p.add_argument("--size", default="8x64")
    p.add_argument("--periods", default="1,2,3,4,5")
    p.add_argument("--time-limit", type=float, default=120.0, help="seconds per period")
    args = p.parse_args()
    if not args.profile.is_file():
        print(f"skipped: reference profile {args.profile} is absent")
        return 0
    try:
        periods = [int(x) for x in args.periods.split(",")]
    except ValueError:
        p.error("--periods takes comma-separated integers, e.g. 1,2,5")
    if any(x < 1 for x in periods):
        p.error("--periods must be >= 1")
    try:
        S, M = (int(x) for x in args.size.split("x"))
    except ValueError:
        p.error("--size takes SxM, e.g. 8x64")
    if S < 2 or M <= 2 * S:
        p.error("--size: the steady state needs S >= 2 and M > 2*S")
    profile, schedule, frontier = reference_frontier(args.profile, args.size)
    fastest = frontier.points[0]
    P = P_BLOCK_W
    pipeline = PipelineProblem(profile, schedule, P)
    problem = pipeline.solver
    rounder = Rounder(problem)
    where = {
        (ins.rank, ins.kind, ins.microbatch): k for k, ins in enumerate(pipeline.instructions)
    }

    def options_of(s: int, kind: str) -> tuple[np.ndarray, np.ndarray, CostHull]:
        """The options that can pay (the rounder's staircase): times, costs ``e − P·t``."""
        ty = problem.type_of[where[s, kind, 0]]
        o = rounder.staircase(ty)
        t = problem.opt_time[ty, o]
        return t, problem.opt_energy[ty, o] - P * t, problem.hulls[ty]

    table = {
        (s, k): options_of(s, kind)
        for s in range(S - 1)
        for k, kind in (("F", "forward"), ("B", "backward"))
    }
    all_max_s = problem.choices_to_arrays(problem.reference_choice())[0]
    pace = float(sum(all_max_s[where[S - 1, kind, 0]] for kind in ("forward", "backward")))
    lp_cycle = sum(lockstep_pair(table[s, "F"][2], table[s, "B"][2], pace) for s in range(S - 1))

    # Our fastest plan in its middle cycles: B_s(j) and the forward after it, F_s(j + S − s).
    choice = pipeline.choice_of(fastest.frequencies)
    t_all, e_all = problem.choices_to_arrays(choice)
    cycles = range(S, M - S)
    ours = sum(
        (e_all[where[s, "backward", j]] - P * t_all[where[s, "backward", j]])
        + (e_all[where[s, "forward", j + S - s]] - P * t_all[where[s, "forward", j + S - s]])
        for s in range(S - 1)
        for j in cycles
    ) / len(cycles)
    budget = 0.005 * fastest.lower_bound_j / M
    print(
        f"{S}x{M}, fastest point T = {fastest.iteration_time_s:.5f} s: pace {1e3 * pace:.3f} ms, "
        f"lock-step LP {lp_cycle:.3f} J per cycle (stages 0..{S - 2})"
    )
    print(
        f"ours, cycles {cycles.start}..{cycles.stop - 1}: {ours - lp_cycle:.3f} J per cycle above it; "
        f"whole plan {100 * fastest.gap:.3f} % above the LP bound; "
        f"0.5 % of the bound is {budget:.3f} J per cycle"
    )
    print(
        f"{'period':>6} {'best found':>11} {'proven >=':>10}  excess per cycle: best / bound  status"
    )
    options = {key: (t, cost) for key, (t, cost, _) in table.items()}
    for period in periods:
        t0 = time.perf_counter()
        best, dual, status, chosen = periodic_optimum(options, S, pace, period, args.time_limit)
        print(
            f"{period:6d} {best / period:11.3f} {dual / period:10.3f}  "
            f"{best / period - lp_cycle:7.3f} / {dual / period - lp_cycle:.3f} J  "
            f"{status.split('.')[0]} ({time.perf_counter() - t0:.0f} s)"
        )
        for s in range(S - 1):
            pattern = (
                "  ".join(
                    f"{1e3 * chosen[s, 'B', j]:.2f}/{1e3 * chosen[s, 'F', j]:.2f}"
                    for j in range(period)
                )
                if chosen
                else "-"
            )
            print(f"{'':8}stage {s} (B/F ms): {pattern}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
