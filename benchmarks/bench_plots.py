"""Benchmark: the pictures `perseus solve` writes vs the solve itself, in one run.

Usage::

    python benchmarks/bench_plots.py [--profile PATH] [--size 8x48] [--repeat 3]

On the real GPT-3 175B A40 profile (read in place from ``../shared/data``; skipped without
it), synchronous 1F1B with S stages and M microbatches, it times what `perseus solve` does
without plots (`solve_frontier`, `Frontier.write`, the all-max evaluation) and then the
pictures it writes with them (`frontier.png` with its marks, `timeline_fastest.png`, and
`timeline_no_slowdown.png` when that plan differs), and prints plots / solve. Target: ≤ 0.5.
The best of `--repeat` runs of each is reported.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_solver import DEFAULT_PROFILE, P_BLOCK_W

from perseus.domain.profile import InstructionProfile
from perseus.domain.schedule import make_schedule
from perseus.io.plan_file import load_plan
from perseus.planning import evaluate, max_frequencies, solve_frontier
from perseus.plotting import plot_frontier, plot_timeline


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    parser.add_argument("--size", default="8x48", help="SxM (1f1b)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if not args.profile.is_file():
        print(f"skipped: no profile at {args.profile}")
        return 0
    S, M = (int(x) for x in args.size.lower().split("x"))
    base_rows = pd.read_csv(args.profile)[["stage", "instruction", "frequency", "time", "energy"]]
    profile = InstructionProfile.from_frame(base_rows, source=args.profile.name)
    schedule = make_schedule("1f1b", S, M)
    solve_s, plots_s = [], []
    for _ in range(max(1, args.repeat)):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp)
            t0 = time.perf_counter()
            frontier = solve_frontier(profile, schedule, p2p_power_w=P_BLOCK_W)
            frontier.write(out)
            base = evaluate(profile, schedule, max_frequencies(profile, schedule), P_BLOCK_W)
            t1 = time.perf_counter()
            # As `perseus solve` draws them (perseus/cli/solve.py).
            points = frontier.points
            no_slowdown = frontier.choose(max_slowdown=0.0)
            index = points.index(no_slowdown)
            plot_frontier(
                out,
                baseline=(base.iteration_time_s, base.energy_j),
                no_slowdown=(no_slowdown.iteration_time_s, no_slowdown.energy_j),
            )
            fastest = load_plan(out / "plans" / "plan_00000.json")
            plot_timeline(profile, fastest, out / "timeline_fastest.png")
            if index != 0:
                chosen = load_plan(out / "plans" / f"plan_{index:05d}.json")
                plot_timeline(profile, chosen, out / "timeline_no_slowdown.png")
            t2 = time.perf_counter()
            pictures = sorted(p.name for p in out.glob("*.png"))
        solve_s.append(t1 - t0)
        plots_s.append(t2 - t1)
    solve, plots = min(solve_s), min(plots_s)
    print(
        f"1f1b {S}x{M} ({len(points)} plans): solve {solve:.2f} s, plots {plots:.2f} s "
        f"({', '.join(pictures)}), plots / solve = {plots / solve:.2f} (target ≤ 0.5)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
