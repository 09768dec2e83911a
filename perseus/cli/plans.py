"""`perseus evaluate`, `perseus choose`, `perseus polish`: commands on one plan."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from perseus.cli._common import (
    EMULATED_NOTE,
    AllowImplausiblePower,
    cli_errors,
    console,
    err_console,
    fraction_progress,
    narrow_table,
    resolve_profile_path,
)
from perseus.domain.units import max_slowdown_problem
from perseus.errors import PerseusError

__all__ = ["choose", "evaluate_plan", "polish"]


@cli_errors
def evaluate_plan(
    profile: Annotated[str, typer.Argument(help="Profile CSV, or the name of a shipped profile.")],
    plan: Annotated[Path, typer.Argument(help="Plan JSON file.")],
    switch_latency_ms: Annotated[
        float | None,
        typer.Option(
            "--switch-latency-ms",
            min=0.0,
            max=10_000.0,
            help="Score with clock changes taking this long (ms); default: the plan's own.",
        ),
    ] = None,
    hop_latency_ms: Annotated[
        float | None,
        typer.Option(
            "--hop-latency-ms",
            min=0.0,
            max=10_000.0,
            help="Score with every P2P hop between ranks taking this long (ms); default: "
            "the plan's own.",
        ),
    ] = None,
    allow_implausible_power: AllowImplausiblePower = False,
) -> None:
    """Score a plan exactly against a profile; prints JSON."""
    from perseus.io.plan_file import load_plan
    from perseus.io.profile_csv import load_profile
    from perseus.planning import evaluate_plan

    prof = load_profile(resolve_profile_path(profile), check_power=not allow_implausible_power)
    loaded = load_plan(plan)
    from perseus.domain.plan import clock_changes

    latency_s = loaded.switch_latency if switch_latency_ms is None else switch_latency_ms / 1000
    hop_s = loaded.hop_latency if hop_latency_ms is None else hop_latency_ms / 1000
    ev = evaluate_plan(prof, loaded, switch_latency_s=latency_s, hop_latency_s=hop_s)
    report: dict[str, float | bool | int] = {
        "iteration_time": ev.iteration_time_s,
        "energy": ev.energy_j,
        "compute_energy": ev.compute_energy_j,
        "blocking_energy": ev.blocking_energy_j,
        "clock_changes": clock_changes(loaded.stage_frequencies()),
        "switch_latency": latency_s,
        "hop_latency": hop_s,
    }
    if prof.emulated or loaded.emulated:
        report["emulated"] = True  # the numbers are the emulator's model
    typer.echo(json.dumps(report))


@cli_errors
def choose(
    frontier_dir: Annotated[Path, typer.Argument(help="Directory written by `perseus solve`.")],
    max_slowdown: Annotated[
        float | None,
        typer.Option(
            "--max-slowdown",
            help="Allowed slowdown vs. the all-max-frequency plan, e.g. 0.05 (0: the "
            "cheapest plan no slower than all-max).",
        ),
    ] = None,
    deadline: Annotated[
        float | None, typer.Option("--deadline", help="Iteration time limit in seconds.")
    ] = None,
) -> None:
    """Print the path of the minimum-energy plan that meets a slowdown or a deadline.

    The path goes to stdout alone (so that $(perseus choose ...) is the path); the plan's
    time, energy, saving and slowdown against all-max follow it on stderr.
    """
    from perseus.io.frontier_dir import (
        frontier_plan_file,
        read_frontier_table,
        read_reference_plan,
    )
    from perseus.planning import choose_index

    if (max_slowdown is None) == (deadline is None):
        raise PerseusError("Give exactly one of --max-slowdown or --deadline")
    problem = (
        max_slowdown_problem(max_slowdown, name="--max-slowdown")
        if max_slowdown is not None
        else None
    )
    if problem:
        raise PerseusError(problem)
    table = read_frontier_table(frontier_dir)  # rows in index order
    reference = read_reference_plan(frontier_dir)
    reference_s = reference.iteration_time if reference is not None else table.iteration_time[0]
    k = choose_index(
        table.iteration_time,
        table.energy,
        max_slowdown=max_slowdown,
        deadline_s=deadline,
        reference_s=reference_s if max_slowdown is not None else None,
    )
    path = frontier_plan_file(frontier_dir, table, k)  # written from plans.npz if compact
    typer.echo(str(path))
    time_s, energy_j = float(table.iteration_time[k]), float(table.energy[k])
    figures = f"{path.name}: {time_s:.4f} s, {energy_j:.1f} J per iteration"
    if reference is not None and reference.energy > 0:
        figures += (
            f"; {100 * (1 - energy_j / reference.energy):.2f} % energy saved at "
            f"{100 * (time_s / reference.iteration_time - 1):+.2f} % time against all-max "
            f"({reference.iteration_time:.4f} s, {reference.energy:.1f} J)"
        )
    else:
        figures += (
            f"; {100 * (time_s / reference_s - 1):+.2f} % time against the fastest plan "
            "(no all_max.json here: saving unknown)"
        )
    err_console.print(figures, highlight=False, soft_wrap=True)


@cli_errors
def polish(
    profile: Annotated[str, typer.Argument(help="Profile CSV, or the name of a shipped profile.")],
    plan: Annotated[
        Path, typer.Argument(help="Plan JSON file, e.g. one `perseus choose` printed.")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the polished plan.")],
    window: Annotated[
        float | None,
        typer.Option(
            help="Seconds of the schedule re-chosen together "
            "(default: 7.5 mean instruction durations, about four 1F1B cycles)."
        ),
    ] = None,
    window_time_limit: Annotated[
        float, typer.Option(help="Seconds one window's MILP may take.")
    ] = 5.0,
    passes: Annotated[
        int, typer.Option(help="Sweeps over the plan, each with its windows shifted.")
    ] = 2,
    budget: Annotated[
        float | None, typer.Option(help="Seconds the whole polish may take (default: no limit).")
    ] = None,
    allow_implausible_power: AllowImplausiblePower = False,
) -> None:
    """Lower one plan's energy at no longer iteration time (exact MILP over sliding windows).

    Takes minutes on large pipelines: meant for the plan you deploy, not a whole frontier.
    """
    from perseus.domain.plan import Plan
    from perseus.io.plan_file import load_plan, save_plan
    from perseus.io.profile_csv import load_profile
    from perseus.planning import PipelineProblem, evaluate
    from perseus.solver.lp import solve_lp_curve
    from perseus.solver.polish import polish_plan

    prof = load_profile(resolve_profile_path(profile), check_power=not allow_implausible_power)
    original = load_plan(plan)
    sched = original.pipeline_schedule()
    # The windows are re-chosen with the plan's own hop latency on the DAG's edges.
    pipeline = PipelineProblem(prof, sched, original.p2p_power, hop_latency_s=original.hop_latency)
    problem = pipeline.solver
    choice = pipeline.choice_of(original.stage_frequencies())
    with fraction_progress("polishing") as progress:
        task = progress.add_task(f"{plan.name}", total=1.0)
        result = polish_plan(
            problem,
            choice,
            window_s=window,
            window_time_limit_s=window_time_limit,
            passes=passes,
            budget_s=budget,
            progress=lambda f: progress.update(task, completed=f),
        )
    freqs = pipeline.frequencies_of(result.choice)
    ev = evaluate(prof, sched, freqs, original.p2p_power, hop_latency_s=original.hop_latency)
    if prof.emulated:
        console.print(EMULATED_NOTE, style="yellow", highlight=False, soft_wrap=True)
    save_plan(
        Plan.from_frequencies(
            sched,
            freqs,
            p2p_power_w=original.p2p_power,
            evaluation=ev,
            emulated=prof.emulated or original.emulated,
            hop_latency_s=original.hop_latency,
        ),
        out,
    )
    lp = solve_lp_curve(problem)
    rows = []
    for label, T, E in (
        ("before", result.initial_iteration_time_s, result.initial_energy_j),
        ("after", ev.iteration_time_s, ev.energy_j),
    ):
        bound = float(lp.lower_bound(T))
        rows.append([label, f"{T:.5f}", f"{E:.2f}", f"{100 * (E / bound - 1):.3f} %"])
    table = narrow_table(
        f"Polish of {plan}",
        ["plan", "time", "energy", "gap"],
        rows,
        caption="per iteration: time in s, energy in J; gap: energy above the LP lower bound",
    )
    console.print(table)
    note = "" if result.complete else " (stopped by --budget before the last window)"
    console.print(
        f"{result.improved_windows} of {result.windows} windows improved{note}; "
        f"polished plan written to [bold]{out}[/]"
    )
