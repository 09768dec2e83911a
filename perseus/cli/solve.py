"""`perseus solve`: a profile's whole time-energy frontier, one plan per point."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Annotated

import typer

from perseus.cli._common import (
    EMULATED_NOTE,
    AllowImplausiblePower,
    cli_errors,
    console,
    estimates_note,
    fraction_progress,
    narrow_table,
    resolve_profile_path,
)
from perseus.domain.kinds import SCHEDULES
from perseus.errors import PerseusError

__all__ = ["solve"]


@cli_errors
def solve(
    profile: Annotated[str, typer.Argument(help="Profile CSV, or the name of a shipped profile.")],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Output directory for frontier.csv and plans/.")
    ],
    microbatches: Annotated[
        int, typer.Option("--microbatches", "-m", help="Microbatches per iteration (M).")
    ],
    stages: Annotated[
        int | None,
        typer.Option("--stages", "-s", help="Pipeline stages (S); default: the profile's."),
    ] = None,
    schedule: Annotated[
        str, typer.Option(help=f"Pipeline schedule: {' | '.join(SCHEDULES)}.")
    ] = "1f1b",
    chunks: Annotated[int, typer.Option(help="Model chunks per stage (interleaved only).")] = 2,
    split_backward: Annotated[
        float | None,
        typer.Option(
            help="For zb: derive backward_input / backward_weight from a profile's backward "
            "rows, I taking this share of B's time and energy at every clock, W the rest "
            "(0.5: T_F ≈ T_I ≈ T_W, the ZB paper's assumption); stages with I/W rows keep them."
        ),
    ] = None,
    p2p_power_w: Annotated[
        float | None,
        typer.Option(
            "--p2p-power",
            help="GPU power (W) while blocked on P2P / idle in bubbles (default: the GPU "
            "spec's, the GPU named by --gpu or matched by the profile's clocks; else 70.38 W, "
            "the A40's).",
        ),
    ] = None,
    gpu: Annotated[
        str | None,
        typer.Option(
            "--gpu",
            help="The GPU the profile was measured on (A40, A100-SXM, H100-SXM): its "
            "blocking power and power range (default: matched by the profile's clocks).",
        ),
    ] = None,
    plots: Annotated[bool, typer.Option(help="Also write frontier.png and timeline PNGs.")] = True,
    switch_latency_ms: Annotated[
        float,
        typer.Option(
            "--switch-latency-ms",
            min=0.0,
            max=10_000.0,
            help="How long a clock change takes to apply on the GPU, ms (10-20 on real "
            "GPUs; the emulated ones take ZEUS_EMULATED_SWITCH_LATENCY_MS, 15 unless set). "
            "Plans then count it: changes they cannot reach in time are dropped and every "
            "time and energy includes the switches. The default, 0, plans changes as free.",
        ),
    ] = 0.0,
    hop_latency_ms: Annotated[
        float,
        typer.Option(
            "--hop-latency-ms",
            min=0.0,
            max=10_000.0,
            help="How long each P2P hop between two pipeline ranks takes (ms; tens to "
            "hundreds of µs with NCCL, 1-3 ms with gloo on one host). The solver plans for "
            "it: plans leave the slack the hops need, and every time and energy includes "
            "them. 0: hops are free.",
        ),
    ] = 0.0,
    allow_implausible_power: AllowImplausiblePower = False,
) -> None:
    """Compute the whole iteration-time vs energy frontier and write one plan per point.

    `--stages` counts pipeline ranks. A profile may hold one stage per rank, or, for a
    schedule with several stages per rank (interleaved), one per pipeline (virtual) stage:
    e.g. an 8-stage profile with `--schedule interleaved --chunks 2 --stages 4`.
    """
    from perseus.domain.kinds import BACKWARD_SPLIT
    from perseus.domain.plan import clock_changes
    from perseus.domain.schedule import instructions_per_stage, make_schedule, schedule_name
    from perseus.errors import ScheduleError
    from perseus.io.plan_file import load_plan
    from perseus.io.profile_csv import load_profile
    from perseus.planning.gpu import blocking_power, named_gpu

    if gpu is not None:
        named_gpu(gpu)  # an unknown name fails before the profile is read
    if out.exists() and not out.is_dir():  # say so now, not after a long solve
        raise PerseusError(
            f"--out {str(out)!r} is a file; give a directory for frontier.csv and plans/"
        )
    prof = load_profile(resolve_profile_path(profile), check_power=not allow_implausible_power)
    blocking = blocking_power(prof, p2p_power_w, gpu=gpu)
    p2p_power_w = blocking.watts
    if split_backward is not None:
        prof = prof.split_backward(split_backward)
    num_stages = stages if stages is not None else prof.num_stages
    from perseus.planning import check_frontier_memory, solve_frontier

    if num_stages >= 1 and microbatches >= 1:  # else make_schedule names the bad count
        # Before building the schedule: a size that cannot be solved fails in a second.
        per_stage = instructions_per_stage(schedule, microbatches, chunks)
        check_frontier_memory(num_stages * per_stage, schedule_name(schedule))
    sched = make_schedule(schedule, num_stages, microbatches, num_chunks=chunks)
    try:
        sched.check_profile(prof)
    except ScheduleError as exc:
        split = set(BACKWARD_SPLIT)
        if split <= set(sched.instruction_kinds()) and not split <= set(prof.kinds()):
            raise PerseusError(
                f"{exc}. Pass --split-backward 0.5 to derive the input- and weight-gradient "
                "halves from the backward rows, or profile the split backward"
            ) from None
        raise

    if prof.emulated:
        console.print(EMULATED_NOTE, style="yellow", highlight=False, soft_wrap=True)
    note = estimates_note(prof.estimates())
    if note is not None:
        console.print(note, style="yellow", highlight=False, soft_wrap=True)
    console.print(f"Blocking (P2P) power {blocking.describe()}", highlight=False, soft_wrap=True)
    with fraction_progress("solving") as progress:
        task = progress.add_task(
            f"{sched.name} S={sched.num_stages} M={sched.num_microbatches}", total=1.0
        )
        frontier = solve_frontier(
            prof,
            sched,
            p2p_power_w=p2p_power_w,
            progress=lambda f: progress.update(task, completed=f),
            switch_latency_s=switch_latency_ms / 1000.0,
            hop_latency_s=hop_latency_ms / 1000.0,
        )
    frontier.write(out)
    # The all-max plan, scored by the solve (with its switching latency): the baseline that
    # `frontier.slowdown` measures against, so the table's columns share it.
    base = frontier.all_max
    if base is None:  # solve_frontier always keeps it
        raise PerseusError("The solve kept no all-max plan to measure slowdowns against")
    points = frontier.points
    rows = [
        [
            "all max frequency",
            f"{base.iteration_time_s:.4f}",
            f"{base.energy_j:.1f}",
            "—",
            "—",
            str(clock_changes(base.frequencies)),
            "—",
        ]
    ]
    # Slowdowns are against all-max; where its top clock is power-capped, the fastest
    # plan beats it (a negative slowdown) and "no slowdown" may use any clocks.
    shown = {}
    if points[0].iteration_time_s < base.iteration_time_s:
        shown["fastest"] = points[0]
    for label, slowdown in (("no slowdown", 0.0), ("≤ 1 % slower", 0.01), ("≤ 5 % slower", 0.05)):
        shown[label] = frontier.choose(max_slowdown=slowdown)
    shown["minimum energy"] = min(points, key=lambda p: p.energy_j)
    for label, point in shown.items():
        rows.append(
            [
                label,
                f"{point.iteration_time_s:.4f}",
                f"{point.energy_j:.1f}",
                f"{100 * frontier.slowdown(point):+.2f} %",
                f"{100 * (1 - point.energy_j / base.energy_j):.2f} %",
                str(clock_changes(point.frequencies)),
                f"{100 * point.gap:.2f} %",
            ]
        )
    table = narrow_table(
        f"Frontier of {prof.source} — {sched.name}, S={sched.num_stages}"
        + (f" ({sched.num_virtual_stages} stages)" if sched.num_chunks > 1 else "")
        + f", M={sched.num_microbatches}",
        ["plan", "time", "energy", "slowdown", "saved", "changes", "gap"],
        rows,
        caption="per iteration: time in s, energy in J; changes: clock changes (all ranks); "
        "gap: energy above the LP lower bound",
    )
    console.print(table)
    if switch_latency_ms > 0:
        console.print(
            f"Clock changes take {switch_latency_ms:g} ms: every time and energy above counts "
            "them (clock changes: per iteration, all ranks)."
        )
    if hop_latency_ms > 0:
        console.print(
            f"Every P2P hop between ranks takes {hop_latency_ms:g} ms: the plans are solved "
            "for it and every time and energy above includes it."
        )
    console.print(
        f"{len(points)} frontier points written to [bold]{out / 'frontier.csv'}[/] and {out / 'plans'}/"
    )
    console.print(_gap_summary([p.gap for p in points]))
    if plots:
        from perseus.plotting import plot_frontier, plot_timeline

        no_slowdown = shown["no slowdown"]
        chosen_index = points.index(no_slowdown)
        png = plot_frontier(
            out,
            baseline=(base.iteration_time_s, base.energy_j),
            no_slowdown=(no_slowdown.iteration_time_s, no_slowdown.energy_j),
        )
        written = [
            png,
            plot_timeline(
                prof, load_plan(out / "plans" / "plan_00000.json"), out / "timeline_fastest.png"
            ),
        ]
        second = out / "timeline_no_slowdown.png"
        if chosen_index == 0:  # the same plan: one picture, not two identical ones
            second.unlink(missing_ok=True)
            note = " (the no-slowdown plan is the fastest plan: one timeline)"
        else:
            chosen = load_plan(out / "plans" / f"plan_{chosen_index:05d}.json")
            written.append(plot_timeline(prof, chosen, second))
            note = ""
        console.print(f"Plots: {', '.join(map(str, written))}{note}")


def _gap_summary(gaps: list[float]) -> str:
    """One line on how far the plans are from the LP lower bound (no plan can beat it)."""
    known = [g for g in gaps if math.isfinite(g)]
    if not known:
        return "No LP lower bound to compare with."
    return (
        f"Energy above the LP lower bound (no plan can go below it): median "
        f"{100 * statistics.median(known):.2f} %, worst {100 * max(known):.2f} %. "
        "`perseus polish` can lower one plan further."
    )
