"""How much of the gap above the LP bound does `perseus polish` recover?

For one pipeline size of the reference profile, solve the frontier, take the points furthest
above the LP lower bound, polish each plan (`perseus.solver.polish.polish_plan`: exact MILPs
over sliding windows, iteration time held) and print the gap before and after, with the
polish's wall time.

    python benchmarks/polish_gap.py [--size 8x64] [--points 1] [--window-time-limit 5]
                                    [--window SECONDS] [--passes 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_solver import DEFAULT_PROFILE, P_BLOCK_W, reference_frontier

from perseus.planning import PipelineProblem
from perseus.solver.polish import polish_plan


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    p.add_argument("--size", default="8x64")
    p.add_argument("--points", type=int, default=1)
    p.add_argument("--window-time-limit", type=float, default=5.0)
    p.add_argument(
        "--window", type=float, default=None, help="window width in seconds (7.5 mean durations)"
    )
    p.add_argument("--passes", type=int, default=2, help="sweeps over the plan")
    args = p.parse_args()
    if not args.profile.is_file():
        print(f"skipped: reference profile {args.profile} is absent")
        return 0
    profile, schedule, frontier = reference_frontier(args.profile, args.size)
    S, M = schedule.num_stages, schedule.num_microbatches
    pipeline = PipelineProblem(profile, schedule, P_BLOCK_W)
    problem = pipeline.solver
    t_fast = frontier.points[0].iteration_time_s
    worst = sorted(frontier.points, key=lambda q: q.gap, reverse=True)[: args.points]
    print(f"{S}x{M}: {len(frontier.points)} frontier points; polishing the {len(worst)} worst")
    print(
        f"{'slowdown':>9} {'gap before':>10} {'gap after':>10} {'T after/before':>14} {'time':>8}"
    )
    for q in sorted(worst, key=lambda q: q.iteration_time_s):
        t0 = time.perf_counter()
        result = polish_plan(
            problem,
            pipeline.choice_of(q.frequencies),
            window_s=args.window,
            window_time_limit_s=args.window_time_limit,
            passes=args.passes,
        )
        print(
            f"{100 * (q.iteration_time_s / t_fast - 1):8.3f}% {100 * q.gap:9.3f}% "
            f"{100 * (result.energy_j / q.lower_bound_j - 1):9.3f}% "
            f"{result.iteration_time_s / q.iteration_time_s:14.6f} {time.perf_counter() - t0:7.1f}s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
