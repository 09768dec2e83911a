"""Benchmark: frontiers of 1F1B, interleaved 1F1B and zero-bubble (ZB-H1) on one split profile.

Usage::

    python benchmarks/bench_schedules.py [--profile PATH] [--microbatches 32]
                                         [--input-share 0.5] [--chunks 2]
                                         [--timing-size 8x64] [--repeat 1]
                                         [--no-timing] [--no-table] [--timeline PNG]

The profile is the real 8-stage A40 GPT-3 profile (``../shared/data``, read in place) with
every stage's backward *split* into an input-gradient (I) and a weight-gradient (W) half by
one stated rule: at every clock, I takes ``--input-share`` of the measured backward's time
and energy and W the rest (default 0.5, the ZB paper's T_F ≈ T_I ≈ T_W assumption: here I and
W each take half of B, about 1.2 T_F). The full backward rows are kept, so that the three
schedules run on one profile: 1F1B and interleaved use F and B, ZB uses F, I and W.

1. Timing (``--timing-size``, default 8×64): `perseus.planning.solve_frontier` (the whole
   Pareto set) on ``make_schedule("zb", S, M)`` and on ``make_schedule("1f1b", S, M)``,
   measured in the same run, and their ratio. Schedule construction (``from_orders``
   validation and the DAG) is timed apart.
2. Table (8 ranks × ``--microbatches``): for 1F1B, interleaved (``--chunks`` stages per rank;
   the profile has one stage per rank, so each rank's numbers are split evenly over its
   stages: `PipelineSchedule.options` scales by 1/V) and ZB: the frontier's fastest time,
   the all-max-clock plan's time and energy, the cheapest plan with ``T ≤`` that schedule's
   all-max time (energy at no slowdown), the saving, and that plan's mean clock per kind.

Nothing is written unless ``--timeline PNG`` asks for the ZB no-slowdown plan's Gantt chart.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from bench_solver import DEFAULT_PROFILE, P_BLOCK_W  # this script's folder is on sys.path

from perseus.domain.profile import InstructionProfile
from perseus.domain.schedule import PipelineSchedule, make_schedule
from perseus.planning import Frontier, evaluate, make_plan, max_frequencies, solve_frontier

TABLE_SCHEDULES = ("1f1b", "interleaved", "zb", "torch-zb")
_SHORT = {"forward": "F", "backward": "B", "backward_input": "I", "backward_weight": "W"}


def torch_zb_orders(S: int, M: int, V: int) -> list[list[tuple[int, str, int]]]:
    """torch's `ScheduleInterleavedZeroBubble` (ZB1P) order for S ranks × V stages each,
    computed without process groups by its (private) per-rank planner; its ``None``
    bubbles are dropped. Raises ImportError/AttributeError when torch lacks it."""
    from types import SimpleNamespace

    from torch.distributed.pipelining.schedules import ScheduleInterleavedZeroBubble

    kind = {"F": "forward", "I": "backward_input", "W": "backward_weight", "B": "backward"}
    rounds = max(1, M // S)
    state = SimpleNamespace(
        pp_group_size=S,
        n_local_stages=V,
        _n_microbatches=M,
        number_of_rounds=rounds,
        microbatches_per_round=M // rounds,
    )
    plan = ScheduleInterleavedZeroBubble._calculate_single_rank_operations
    return [
        [
            (a.stage_index, kind[a.computation_type.value], a.microbatch_index)
            for a in plan(state, rank)
            if a is not None
        ]
        for rank in range(S)
    ]


def split_profile(base: pd.DataFrame, input_share: float) -> InstructionProfile:
    """The profile with every backward also split into I (``input_share`` of B's time and
    energy at every clock) and W (the rest); the full backward rows are kept."""
    if not 0 < input_share < 1:
        raise ValueError(f"--input-share must be strictly between 0 and 1, got {input_share}")
    backward = base[base["instruction"] == "backward"]
    halves = []
    for kind, share in (("backward_input", input_share), ("backward_weight", 1 - input_share)):
        rows = backward.copy()
        rows["instruction"] = kind
        rows["time"] *= share
        rows["energy"] *= share
        halves.append(rows)
    return InstructionProfile.from_frame(
        pd.concat([base, *halves], ignore_index=True),
        source=f"split-{input_share:g}",
    )


def solve(profile: InstructionProfile, schedule: PipelineSchedule) -> tuple[Frontier, float, float]:
    """The whole frontier, its wall and CPU seconds."""
    start, cpu = time.perf_counter(), time.process_time()
    frontier = solve_frontier(profile, schedule, p2p_power_w=P_BLOCK_W, max_points=None)
    return frontier, time.perf_counter() - start, time.process_time() - cpu


def build(name: str, S: int, M: int, chunks: int) -> tuple[PipelineSchedule, float]:
    """A schedule with its DAG (built and checked in `from_orders`) and the seconds: a
    built-in one, or ``torch-zb`` (torch's interleaved zero-bubble order, `chunks` stages
    per rank)."""
    start = time.perf_counter()
    if name == "torch-zb":
        schedule = PipelineSchedule.from_orders(name, torch_zb_orders(S, M, chunks), M)
    else:
        schedule = make_schedule(name, S, M, num_chunks=chunks)
    schedule.instructions()  # the topological order the solver lays out, cached
    return schedule, time.perf_counter() - start


def timing(profile: InstructionProfile, S: int, M: int, repeat: int) -> None:
    """Solve time of ZB vs 1F1B of the same size (best of `repeat`, alternating)."""
    build("1f1b", 2, 2, 1)  # imports (networkx) outside the timed builds
    best: dict[str, list[float]] = {}
    for _ in range(repeat):
        for name in ("1f1b", "zb"):
            schedule, build_s = build(name, S, M, 1)
            frontier, wall, cpu = solve(profile, schedule)
            times = best.setdefault(name, [math.inf, math.inf, math.inf])
            times[:] = [min(times[0], build_s), min(times[1], wall), min(times[2], cpu)]
            print(
                f"  {name:>4} {S}x{M}: {schedule.num_instructions} instructions, schedule+DAG "
                f"{build_s:.2f} s, solve_frontier {wall:.2f} s (CPU {cpu:.2f} s), "
                f"{len(frontier)} plans",
                flush=True,
            )
    try:
        same = torch_zb_orders(S, M, 1) == make_schedule("zb", S, M).actions()
        print(f"  torch's ZB order with one stage per rank is make_schedule('zb')'s: {same}")
    except (ImportError, AttributeError, TypeError) as exc:
        print(f"  torch's ZB order: not compared ({type(exc).__name__}: {exc})")
    z, o = best["zb"], best["1f1b"]
    print(
        f"  best of {repeat}: 1F1B {o[1]:.2f} s (CPU {o[2]:.2f} s), ZB {z[1]:.2f} s (CPU "
        f"{z[2]:.2f} s); ratio ZB/1F1B {z[1] / o[1]:.2f}× wall, {z[2] / o[2]:.2f}× CPU "
        f"({z[2] / o[2] * 2 / 3:.2f}× per instruction); schedule+DAG {o[0]:.2f} s vs {z[0]:.2f} s"
    )


@dataclass
class Row:
    name: str
    instructions: int
    solve_s: float
    t_fast: float
    t_max: float
    e_max: float
    t_chosen: float
    e_chosen: float
    clocks: dict[str, float]

    @property
    def saving(self) -> float:
        return 1 - self.e_chosen / self.e_max


def table_row(
    profile: InstructionProfile, name: str, S: int, M: int, chunks: int
) -> tuple[Row, PipelineSchedule, list[list[int]]]:
    schedule, _ = build(name, S, M, chunks)
    frontier, wall, _ = solve(profile, schedule)
    all_max = evaluate(profile, schedule, max_frequencies(profile, schedule), P_BLOCK_W)
    chosen = frontier.choose(deadline_s=all_max.iteration_time_s)
    freqs = chosen.frequencies
    per_kind: dict[str, list[int]] = {}
    for order, fs in zip(schedule.orders, freqs, strict=True):
        for instr, f in zip(order, fs, strict=True):
            per_kind.setdefault(instr.kind, []).append(f)
    row = Row(
        name=name,
        instructions=schedule.num_instructions,
        solve_s=wall,
        t_fast=frontier.points[0].iteration_time_s,
        t_max=all_max.iteration_time_s,
        e_max=all_max.energy_j,
        t_chosen=chosen.iteration_time_s,
        e_chosen=chosen.energy_j,
        clocks={k: float(np.mean(v)) for k, v in per_kind.items()},
    )
    return row, schedule, freqs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    parser.add_argument("--microbatches", type=int, default=32, help="M of the table (8 ranks)")
    parser.add_argument(
        "--input-share",
        type=float,
        default=0.5,
        help="I's share of the backward's time and energy at every clock (W gets the rest)",
    )
    parser.add_argument("--chunks", type=int, default=2, help="stages per rank (interleaved)")
    parser.add_argument("--timing-size", default="8x64", help="SxM of the ZB vs 1F1B timing")
    parser.add_argument("--repeat", type=int, default=1, help="timing runs (best is kept)")
    parser.add_argument("--no-timing", action="store_true")
    parser.add_argument("--no-table", action="store_true")
    parser.add_argument(
        "--timeline", type=Path, default=None, help="draw the ZB no-slowdown plan here (PNG)"
    )
    args = parser.parse_args(argv)
    if not args.profile.is_file():
        print(f"profile {args.profile} not found: nothing to benchmark (pass --profile PATH)")
        return 0
    try:
        S_t, M_t = (int(x) for x in args.timing_size.lower().split("x"))
    except ValueError:
        parser.error(f"bad --timing-size {args.timing_size!r}: use SxM, e.g. 8x64")
    if args.microbatches < 1 or args.chunks < 1 or args.repeat < 1:
        parser.error("--microbatches, --chunks and --repeat must be at least 1")
    base = pd.read_csv(args.profile)[["stage", "instruction", "frequency", "time", "energy"]]
    if S_t != int(base["stage"].max()) + 1:
        parser.error(f"--timing-size must use the profile's {int(base['stage'].max()) + 1} stages")
    try:
        profile = split_profile(base, args.input_share)
    except ValueError as exc:
        parser.error(str(exc))
    S = profile.num_stages
    print(
        f"profile {args.profile.name} with B split into I = {args.input_share:g}·B and "
        f"W = {1 - args.input_share:g}·B (time and energy, every clock), P_block "
        f"{P_BLOCK_W} W, {os.cpu_count()} CPU(s)"
    )
    if not args.no_timing:
        print(f"\nsolve_frontier (whole Pareto set), ZB vs 1F1B at {S_t}x{M_t}:")
        timing(profile, S_t, M_t, args.repeat)
    if args.no_table:
        return 0
    M, V = args.microbatches, args.chunks
    print(f"\nfrontiers on {S} ranks × {M} microbatches (interleaved: {V} stages per rank):")
    rows: list[Row] = []
    zb: tuple[PipelineSchedule, list[list[int]]] | None = None
    for name in TABLE_SCHEDULES:
        try:
            row, schedule, freqs = table_row(profile, name, S, M, V)
        except (ImportError, AttributeError, TypeError) as exc:  # torch absent or changed
            print(f"  {name}: skipped ({type(exc).__name__}: {exc})")
            continue
        rows.append(row)
        if name == "zb":
            zb = (schedule, freqs)
        print(
            f"  {name}: {row.instructions} instructions solved in {row.solve_s:.2f} s", flush=True
        )
    print()
    print(
        "| schedule | instructions | solve | fastest T | all-max T | all-max E | "
        "E at no slowdown (T) | saving | mean clock at no slowdown |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    ref = rows[0]
    for r in rows:
        label = {
            "interleaved": f"interleaved 1F1B (V={V})",
            "torch-zb": f"torch's interleaved ZB (V={V})",
            "zb": "ZB-H1",
        }.get(r.name, r.name.upper())
        vs = "" if r is ref else f" ({100 * (r.t_fast / ref.t_fast - 1):+.1f} %)"
        clocks = ", ".join(f"{_SHORT[k]} {v:.0f}" for k, v in r.clocks.items())
        print(
            f"| {label} | {r.instructions} | {r.solve_s:.2f} s | {r.t_fast:.3f} s{vs} | "
            f"{r.t_max:.3f} s | {r.e_max:.0f} J | {r.e_chosen:.0f} J ({r.t_chosen:.3f} s) | "
            f"{100 * r.saving:.1f} % | {clocks} MHz |"
        )
    if args.timeline is not None and zb is not None:
        from perseus.plotting import plot_timeline

        schedule, freqs = zb
        plan = make_plan(profile, schedule, freqs, P_BLOCK_W)
        print(f"\nZB timeline: {plot_timeline(profile, plan, args.timeline)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
