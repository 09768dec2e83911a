"""Benchmark: our frontier solver vs lowtime 0.3.0 on the same 1F1B DAG and profile.

Usage::

    python benchmarks/bench_solver.py [--profile PATH] [--sizes 4x8,8x32,8x64,16x256]
                                      [--no-lowtime] [--perturb SIGMA]

For every size ``SxM`` it builds the synchronous 1F1B schedule with S stages and M
microbatches, times `perseus.planning.solve_frontier` (whole Pareto set kept), times
lowtime's Phillips–Dessouky solver on the same DAG (`lowtime_baseline.py`, 1 ms time
unit, exponential cost model, P_block-adjusted costs, as in lowtime's Perseus example),
and scores *both* solvers' plans with the same exact accounting (`perseus.planning.evaluate`'s
arithmetic). It prints the wall-time ratio, our energy vs lowtime's at every lowtime
deadline (our best plan with ``T ≤`` lowtime's ``T``), our gap above the LP bound, and the
fast end against all-max: the fastest plan's time and energy, and the energy saved at no
slowdown (the cheapest plan with ``T ≤ T(all-max)``). Where the top clock is power-capped
(the Bloom profile), the fastest plan beats all-max.

Profiles for other stage counts are derived from the 8-stage real profile, whose stages
0–6 are identical layers and stage 7 is the last stage:

- S ≤ 8: stages 0..S−2 are real stages 0..S−2 and stage S−1 is real stage 7;
- S > 8 (tiling): stage s < S−1 is real stage ``s mod 7``, stage S−1 is real stage 7;
  ``--perturb SIGMA`` then multiplies every time and energy of the added stages (8 and
  up) by ``1 + SIGMA·N(0,1)`` (seed 0), so that they are no longer exact copies.

lowtime is skipped where it would take more than about 7 minutes on a 2-core machine
(more than 1024 instructions, i.e. beyond 8×64, which took 387 s); those rows compare
against the LP bound only.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from perseus.domain.profile import InstructionProfile
from perseus.domain.schedule import PipelineSchedule, make_schedule
from perseus.planning import Frontier, PipelineProblem, solve_frontier

P_BLOCK_W = 70.38  # A40 power while blocked on P2P (Perseus artifact)
DEFAULT_PROFILE = (
    Path(__file__).resolve().parents[1].parent
    / "shared"
    / "data"
    / "sosp24_gpt3-175b_a40_8stage.csv"
)
LOWTIME_MAX_INSTRUCTIONS = 2 * 8 * 64


def derive_profile(base: pd.DataFrame, num_stages: int, perturb: float) -> InstructionProfile:
    """A `num_stages` profile from an 8-stage one (see the module docstring)."""
    real = int(base["stage"].max()) + 1
    last = real - 1
    body = list(range(last))
    parts = []
    rng = np.random.default_rng(0)
    for stage in range(num_stages):
        if stage == num_stages - 1:
            source = last
        elif num_stages <= real:
            source = stage
        else:
            source = body[stage % len(body)]
        rows = base[base["stage"] == source].copy()
        rows["stage"] = stage
        if perturb > 0 and stage >= real - 1 and stage != num_stages - 1:
            rows["time"] *= 1 + perturb * rng.standard_normal(len(rows))
            rows["energy"] *= 1 + perturb * rng.standard_normal(len(rows))
        parts.append(rows)
    return InstructionProfile.from_frame(pd.concat(parts), source=f"derived-{num_stages}")


def reference_frontier(
    profile_path: Path, size: str
) -> tuple[InstructionProfile, PipelineSchedule, Frontier]:
    """The reference profile cut to ``"SxM"``, its 1F1B schedule and its full frontier."""
    S, M = (int(x) for x in size.split("x"))
    profile = derive_profile(pd.read_csv(profile_path), S, 0.0)
    schedule = make_schedule("1f1b", S, M)
    frontier = solve_frontier(profile, schedule, p2p_power_w=P_BLOCK_W, max_points=None)
    return profile, schedule, frontier


def plans_to_choice(pipeline: PipelineProblem, plans: list[list[list[int]]]) -> np.ndarray:
    """Per-stage frequency lists → option indices ``(n, K)``."""
    return np.stack([pipeline.choice_of(plan) for plan in plans], axis=1)


@dataclass
class Row:
    size: str
    ours_s: float
    ours_cpu_s: float
    lowtime_s: float | None
    lowtime_cpu_s: float | None
    points: int
    breakpoints: int
    t_fast: float
    t_slow: float
    fastest_vs_all_max: float
    saving_fastest: float
    saving_no_slowdown: float
    vs_lowtime_max: float | None
    vs_lowtime_mean: float | None
    lowtime_worse_count: int | None
    lowtime_deadlines: int | None
    gap_max: float
    gap_max_after_first: float
    gap_median: float
    gap_mean: float
    lowtime_gap_max: float | None
    lowtime_model_err: float | None


def run_size(
    base: pd.DataFrame, S: int, M: int, *, lowtime: bool, perturb: float
) -> tuple[Row, PipelineSchedule]:
    profile = derive_profile(base, S, perturb)
    schedule = make_schedule("1f1b", S, M)
    start, cpu = time.perf_counter(), time.process_time()
    frontier = solve_frontier(profile, schedule, p2p_power_w=P_BLOCK_W, max_points=None)
    ours_s = time.perf_counter() - start
    ours_cpu_s = time.process_time() - cpu
    pipeline = PipelineProblem(profile, schedule, P_BLOCK_W)
    problem = pipeline.solver
    times = np.array([p.iteration_time_s for p in frontier.points])
    energies = np.array([p.energy_j for p in frontier.points])
    bounds = np.array([p.lower_bound_j for p in frontier.points])
    gaps = energies / bounds - 1
    t_max, e_max, _ = problem.score(problem.reference_choice()[:, None])
    no_slowdown = frontier.choose(max_slowdown=0.0)
    row = Row(
        size=f"{S}x{M}",
        ours_s=ours_s,
        ours_cpu_s=ours_cpu_s,
        lowtime_s=None,
        lowtime_cpu_s=None,
        points=len(frontier.points),
        breakpoints=len(frontier.lp_curve.time_s) if frontier.lp_curve is not None else 0,
        t_fast=float(times[0]),
        t_slow=float(times[-1]),
        fastest_vs_all_max=float(times[0] / t_max[0] - 1),
        saving_fastest=float(1 - energies[0] / e_max[0]),
        saving_no_slowdown=float(1 - no_slowdown.energy_j / e_max[0]),
        vs_lowtime_max=None,
        vs_lowtime_mean=None,
        lowtime_worse_count=None,
        lowtime_deadlines=None,
        gap_max=float(gaps.max()),
        gap_max_after_first=float(gaps[1:].max()) if len(gaps) > 1 else math.nan,
        gap_median=float(np.median(gaps)),
        gap_mean=float(gaps.mean()),
        lowtime_gap_max=None,
        lowtime_model_err=None,
    )
    if lowtime and problem.n <= LOWTIME_MAX_INSTRUCTIONS:
        from lowtime_baseline import run_lowtime

        cpu = time.process_time()
        result = run_lowtime(profile, schedule, p2p_power_w=P_BLOCK_W)
        row.lowtime_s = result.wall_s
        row.lowtime_cpu_s = time.process_time() - cpu
        lt_t, lt_e, _ = problem.score(plans_to_choice(pipeline, result.plans))
        at = np.searchsorted(times, lt_t * (1 + 1e-9), side="right") - 1
        ok = at >= 0  # lowtime deadlines at least as slow as our fastest plan (all of them)
        rel = energies[at[ok]] / lt_e[ok] - 1
        row.vs_lowtime_max = float(rel.max())
        row.vs_lowtime_mean = float(rel.mean())
        row.lowtime_worse_count = int((rel > 0).sum())
        row.lowtime_deadlines = int(ok.sum())
        assert frontier.lp_curve is not None
        row.lowtime_gap_max = float((lt_e / frontier.lp_curve.lower_bound(lt_t) - 1).max())
        # lowtime's own energy figure: fitted effective cost + P·S·(its quantised time).
        model_e = np.array(result.model_cost_j) + P_BLOCK_W * S * np.array(result.model_time_s)
        row.lowtime_model_err = float(np.abs(model_e / lt_e - 1).max())
    return row, schedule


def fmt_pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:+.2f} %"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    parser.add_argument("--sizes", default="4x8,8x32,8x64,16x256")
    parser.add_argument("--no-lowtime", action="store_true", help="time our solver only")
    parser.add_argument("--perturb", type=float, default=0.0, help="noise on tiled stages")
    args = parser.parse_args(argv)
    if not args.profile.is_file():
        print(f"profile {args.profile} not found: nothing to benchmark (pass --profile PATH)")
        return 0
    base = pd.read_csv(args.profile)[["stage", "instruction", "frequency", "time", "energy"]]
    sizes = []
    for token in args.sizes.split(","):
        try:
            s, m = (int(x) for x in token.lower().split("x"))
        except ValueError:
            parser.error(f"bad size {token!r}: use SxM, e.g. 8x64")
        sizes.append((s, m))
    print(
        f"profile {args.profile.name}, P_block {P_BLOCK_W} W, 1F1B, {os.cpu_count()} CPU(s)"
        + (f", tiled stages perturbed by {args.perturb}" if args.perturb else "")
    )
    rows = []
    for s, m in sizes:
        row, _ = run_size(base, s, m, lowtime=not args.no_lowtime, perturb=args.perturb)
        rows.append(row)
        lt = (
            "skipped"
            if row.lowtime_s is None
            else f"{row.lowtime_s:.1f} s (CPU {row.lowtime_cpu_s:.1f} s)"
        )
        ratio = "—" if row.lowtime_s is None else f"{row.lowtime_s / row.ours_s:.0f}×"
        print(
            f"{row.size:>7}: ours {row.ours_s:6.2f} s (CPU {row.ours_cpu_s:.2f} s, {row.breakpoints} LP breakpoints, "
            f"{row.points} plans, T {row.t_fast:.3f}..{row.t_slow:.3f} s), lowtime {lt}, "
            f"speed-up {ratio}; ours vs lowtime at its {row.lowtime_deadlines or 0} deadlines: "
            f"max {fmt_pct(row.vs_lowtime_max)}, mean {fmt_pct(row.vs_lowtime_mean)}, "
            f"lowtime better at {row.lowtime_worse_count if row.lowtime_worse_count is not None else '—'}; "
            f"gap above LP bound: max {100 * row.gap_max:.2f} % ({100 * row.gap_max_after_first:.2f} % "
            f"after the fastest point), median {100 * row.gap_median:.2f} %; fastest plan "
            f"{fmt_pct(row.fastest_vs_all_max)} time vs all-max, saves "
            f"{100 * row.saving_fastest:.1f} %; no slowdown saves {100 * row.saving_no_slowdown:.2f} %"
            + (
                ""
                if row.lowtime_model_err is None
                else f"; lowtime's own energy figures are off by up to "
                f"{100 * row.lowtime_model_err:.1f} % from its plans' exact energy"
            ),
            flush=True,
        )
    print()
    print("README table:")
    print()
    print(
        "| size (S×M) | ours (CPU) | lowtime 0.3.0 (CPU) | speed-up (wall) | ours vs lowtime energy at its deadlines "
        "(max / mean) | deadlines where lowtime is better | our gap above LP bound (max / median) "
        "| lowtime gap above LP bound (max) | energy saved at no slowdown "
        "| fastest plan vs all-max: T, energy saved |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        lt = "skipped" if r.lowtime_s is None else f"{r.lowtime_s:.1f} s ({r.lowtime_cpu_s:.1f} s)"
        ratio = "—" if r.lowtime_s is None else f"{r.lowtime_s / r.ours_s:.0f}×"
        vs = (
            "—"
            if r.vs_lowtime_max is None
            else f"{fmt_pct(r.vs_lowtime_max)} / {fmt_pct(r.vs_lowtime_mean)}"
        )
        worse = (
            "—"
            if r.lowtime_worse_count is None
            else f"{r.lowtime_worse_count} of {r.lowtime_deadlines}"
        )
        lt_gap = "—" if r.lowtime_gap_max is None else f"{100 * r.lowtime_gap_max:.2f} %"
        print(
            f"| {r.size.replace('x', '×')} | {r.ours_s:.2f} s ({r.ours_cpu_s:.2f} s) | {lt} | {ratio} | {vs} | {worse} | "
            f"{100 * r.gap_max:.2f} % / {100 * r.gap_median:.2f} % | {lt_gap} | "
            f"{100 * r.saving_no_slowdown:.1f} % | "
            f"{fmt_pct(r.fastest_vs_all_max)}, {100 * r.saving_fastest:.1f} % |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
