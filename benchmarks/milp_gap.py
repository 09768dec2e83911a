"""How far can *any* discrete plan be from the LP bound? An exact MILP answers it.

For one pipeline size, solve the frontier, take the points where our plan is furthest above
the LP lower bound, and at each point's deadline solve the discrete problem exactly
(mixed-integer program, scipy's HiGHS): one binary per (instruction, option that can pay),
start times, ``T ≤ deadline``, minimise ``Σ eᵢ + P_block·(S·T − Σ tᵢ)``. Prints, per point,
the LP bound, the MILP's proven lower bound on the discrete optimum, the best discrete plan
it found (the optimum, when it finishes within the time limit) and ours. When the optimum
itself sits well above the LP bound, that gap is the problem's integrality gap, not the
solver's; what lies between the optimum and ours is the solver's.

    python benchmarks/milp_gap.py [--size 4x8] [--points 5] [--time-limit 120]
    python benchmarks/milp_gap.py --size 4x8 --indices 1,5 --time-limit 60

``--indices`` picks frontier points by index (0 = fastest) instead of the worst ones.
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

from perseus.planning import PipelineProblem, evaluate
from perseus.solver import SolverProblem
from perseus.solver.polish import native_stdout_silenced
from perseus.solver.rounding import Rounder


def staircase_options(problem: SolverProblem) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per instruction, the (time, energy) of every option that can pay: the rounder's
    staircase, where each slower option has a lower ``e − P·t`` than every faster one.

    Not the options undominated in raw (time, energy): a slower option that uses more
    energy still pays when the extra energy is less than ``P·Δt``, the blocking energy it
    saves (e.g. the slowest clocks in the drain). Leaving those out would make the MILP's
    "optimum" and its proven bound those of a smaller problem.
    """
    rounder = Rounder(problem)
    per_type = []
    for ty in range(len(problem.type_options)):
        o = rounder.staircase(ty)
        per_type.append((problem.opt_time[ty, o], problem.opt_energy[ty, o]))
    return [per_type[ty] for ty in problem.type_of]


def discrete_optimum(
    problem: SolverProblem, deadline_s: float, time_limit_s: float
) -> tuple[float, float, str]:
    """Minimum energy of a discrete plan with iteration time ≤ deadline (MILP).

    Returns (best plan found, proven lower bound on the optimum, solver status). When the
    time limit stops the search, the optimum lies between the two.
    """
    opts = staircase_options(problem)
    n = problem.n
    nx_ = sum(len(t) for t, _ in opts)
    # variables: [x (binaries) | start s_i (n) | T]
    nvar = nx_ + n + 1
    c = np.zeros(nvar)
    xoff, col = [], 0
    for t, e in opts:
        xoff.append(col)
        c[col : col + len(t)] = e - problem.p2p_power_w * t
        col += len(t)
    c[-1] = problem.p2p_power_w * problem.num_resources
    edges = problem.edges
    rows = n + len(edges) + n
    a = lil_matrix((rows, nvar))
    lo, hi = np.zeros(rows), np.zeros(rows)
    r = 0
    for k, (t, _) in enumerate(opts):  # exactly one option
        a[r, xoff[k] : xoff[k] + len(t)] = 1
        lo[r] = hi[r] = 1
        r += 1
    for ku, kv in edges:  # s_v - s_u - dur_u >= 0
        a[r, nx_ + kv] = 1
        a[r, nx_ + ku] = -1
        t = opts[ku][0]
        a[r, xoff[ku] : xoff[ku] + len(t)] = -t
        lo[r], hi[r] = 0, np.inf
        r += 1
    for k, (t, _) in enumerate(opts):  # T - s_k - dur_k >= 0
        a[r, -1] = 1
        a[r, nx_ + k] = -1
        a[r, xoff[k] : xoff[k] + len(t)] = -t
        lo[r], hi[r] = 0, np.inf
        r += 1
    integrality = np.r_[np.ones(nx_), np.zeros(n + 1)]
    bounds = Bounds(
        np.r_[np.zeros(nx_), np.zeros(n), 0.0],
        np.r_[np.ones(nx_), np.full(n, deadline_s), deadline_s],
    )
    with native_stdout_silenced():  # HiGHS's stray debug line at a time limit
        res = milp(
            c,
            constraints=LinearConstraint(a.tocsr(), lo, hi),
            integrality=integrality,
            bounds=bounds,
            options={"time_limit": time_limit_s, "mip_rel_gap": 1e-6},
        )
    bound = getattr(res, "mip_dual_bound", None)
    dual = float("nan") if bound is None else float(bound)
    if res.x is None:
        return float("nan"), dual, res.message
    return float(res.fun), dual, res.message


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    p.add_argument("--size", default="4x8")
    p.add_argument("--points", type=int, default=5)
    p.add_argument("--time-limit", type=float, default=120.0)
    p.add_argument(
        "--indices", default="", help="comma-separated frontier indices (0 = fastest) to check"
    )
    args = p.parse_args()
    if not args.profile.is_file():
        print(f"skipped: reference profile {args.profile} is absent")
        return 0
    profile, schedule, frontier = reference_frontier(args.profile, args.size)
    S, M = schedule.num_stages, schedule.num_microbatches
    problem = PipelineProblem(profile, schedule, P_BLOCK_W).solver
    if args.indices:
        try:
            picks = [frontier.points[int(k)] for k in args.indices.split(",")]
        except (ValueError, IndexError):
            p.error(f"--indices takes frontier indices 0..{len(frontier.points) - 1}")
        what = f"points {args.indices}"
    else:
        picks = sorted(frontier.points, key=lambda q: q.energy_j / q.lower_bound_j, reverse=True)[
            : args.points
        ]
        what = f"the {len(picks)} furthest above the LP bound"
    print(f"{S}x{M}: {len(frontier.points)} frontier points; {what}")
    print(
        f"{'deadline (s)':>13} {'slowdown':>9} {'LP bound':>10} {'proven opt >=':>13} {'MILP best':>10} {'ours':>10} "
        f"{'best vs LB':>10} {'ours vs LB':>10} {'ours vs best':>12}  MILP status"
    )
    t_fast = frontier.points[0].iteration_time_s
    for q in sorted(picks, key=lambda q: q.iteration_time_s):
        t0 = time.perf_counter()
        # Energy terms are affine in T; the MILP objective drops nothing (E = c·x + P·S·T).
        opt, dual, status = discrete_optimum(problem, q.iteration_time_s, args.time_limit)
        ours = evaluate(profile, schedule, q.frequencies, P_BLOCK_W).energy_j
        lb = q.lower_bound_j
        print(
            f"{q.iteration_time_s:13.5f} {100 * (q.iteration_time_s / t_fast - 1):8.3f}% {lb:10.2f} {dual:13.2f} {opt:10.2f} {ours:10.2f} "
            f"{100 * (opt / lb - 1):9.3f}% {100 * (ours / lb - 1):9.3f}% {100 * (ours / opt - 1):11.3f}%  "
            f"{status.split('.')[0]} ({time.perf_counter() - t0:.1f} s)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
