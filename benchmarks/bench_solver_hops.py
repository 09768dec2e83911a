"""Benchmark: the frontier solver with P2P hop latency in its DAG vs without, same run.

Usage::

    python benchmarks/bench_solver_hops.py [--profile PATH] [--sizes 8x64]
                                           [--hop-latency-ms 2] [--repeat 3]

For every size ``SxM`` (synchronous 1F1B on the real GPT-3 A40 profile, derived for other
stage counts as `bench_solver.py` does) it times `solve_frontier(..., max_points=None)` with
``hop_latency_s = 0`` and with the given latency, alternating the two (best of
``--repeat``), and prints the time ratio (target ≤ 1.3×). Beside it, the frontiers' quality:
points, gap above the LP bound (max / median), the saving at no slowdown against the
all-max plan scored at the same hop latency, and what the hop-blind frontier's no-slowdown
plan really does once hops take the latency (its slowdown against all-max with hops).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_solver import DEFAULT_PROFILE, P_BLOCK_W, derive_profile

from perseus.domain.schedule import make_schedule
from perseus.planning import Frontier, evaluate, solve_frontier


def _quality(frontier: Frontier) -> tuple[int, float, float, float]:
    """(points, max gap, median gap, saving at no slowdown vs all-max)."""
    energies = np.array([p.energy_j for p in frontier.points])
    bounds = np.array([p.lower_bound_j for p in frontier.points])
    gaps = energies / bounds - 1
    assert frontier.all_max is not None
    saving = 1 - frontier.choose(max_slowdown=0.0).energy_j / frontier.all_max.energy_j
    return len(frontier.points), float(gaps.max()), float(np.median(gaps)), float(saving)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    parser.add_argument("--sizes", default="8x64")
    parser.add_argument("--hop-latency-ms", type=float, default=2.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    if not args.profile.is_file():
        print(f"skipped: profile not found at {args.profile}")
        return 0
    hop_s = args.hop_latency_ms / 1000
    base = pd.read_csv(args.profile)
    print(
        "| size | solve, no hops | solve, hops | ratio | points (no hops / hops) | gap max / median, "
        "no hops | gap max / median, hops | saved at no slowdown, no hops / hops | "
        "hop-blind no-slowdown plan, with hops |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    worst = 0.0
    for size in args.sizes.split(","):
        S, M = (int(x) for x in size.split("x"))
        profile = derive_profile(base, S, 0.0)
        schedule = make_schedule("1f1b", S, M)
        best = {0.0: float("inf"), hop_s: float("inf")}
        frontiers: dict[float, Frontier] = {}
        for _ in range(args.repeat):
            for latency in (0.0, hop_s):
                t0 = time.perf_counter()
                frontiers[latency] = solve_frontier(
                    profile,
                    schedule,
                    p2p_power_w=P_BLOCK_W,
                    max_points=None,
                    hop_latency_s=latency,
                )
                best[latency] = min(best[latency], time.perf_counter() - t0)
        ratio = best[hop_s] / best[0.0]
        worst = max(worst, ratio)
        q0, q1 = _quality(frontiers[0.0]), _quality(frontiers[hop_s])
        blind = frontiers[0.0].choose(max_slowdown=0.0)
        real = evaluate(profile, schedule, blind.frequencies, P_BLOCK_W, hop_latency_s=hop_s)
        hopped_all_max = frontiers[hop_s].all_max
        assert hopped_all_max is not None
        slowdown = real.iteration_time_s / hopped_all_max.iteration_time_s - 1
        print(
            f"| {S}×{M} | {best[0.0]:.2f} s | {best[hop_s]:.2f} s | **{ratio:.2f}×** | "
            f"{q0[0]} / {q1[0]} | {100 * q0[1]:.2f} / {100 * q0[2]:.2f} % | "
            f"{100 * q1[1]:.2f} / {100 * q1[2]:.2f} % | {100 * q0[3]:.1f} / {100 * q1[3]:.1f} % | "
            f"{100 * slowdown:+.2f} % |"
        )
    print(
        f"hop latency {args.hop_latency_ms:g} ms; best of {args.repeat}; worst ratio {worst:.2f}× "
        f"(target ≤ 1.3×)"
    )
    return 0 if worst <= 1.3 else 1


if __name__ == "__main__":
    raise SystemExit(main())
