"""`perseus plot frontier` and `perseus plot timeline`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from perseus.cli._common import AllowImplausiblePower, cli_errors, resolve_profile_path

app = typer.Typer(
    help="Draw the frontier or a plan's per-stage timeline as PNG.", no_args_is_help=True
)


@app.command("frontier", short_help="Energy vs time of every frontier plan (PNG).")
@cli_errors
def frontier(
    frontier_dir: Annotated[Path, typer.Argument(help="Directory written by `perseus solve`.")],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="PNG path (default DIR/frontier.png).")
    ] = None,
) -> None:
    """Energy vs iteration time of every frontier plan, with the LP lower bound (and the
    all-max and no-slowdown plans marked, when the directory has `all_max.json`)."""
    from perseus.io.frontier_dir import read_frontier_table, read_reference_plan
    from perseus.planning import choose_index
    from perseus.plotting import plot_frontier

    reference = read_reference_plan(frontier_dir)
    baseline = no_slowdown = None
    if reference is not None:
        table = read_frontier_table(frontier_dir)
        k = choose_index(
            table.iteration_time,
            table.energy,
            max_slowdown=0.0,
            reference_s=reference.iteration_time,
        )
        baseline = (reference.iteration_time, reference.energy)
        no_slowdown = (table.iteration_time[k], table.energy[k])
    png = plot_frontier(frontier_dir, out, baseline=baseline, no_slowdown=no_slowdown)
    typer.echo(str(png))  # a path: never wrapped


@app.command("timeline", short_help="Per-stage Gantt chart of one plan's iteration (PNG).")
@cli_errors
def timeline(
    plan: Annotated[Path, typer.Argument(help="Plan JSON file.")],
    profile: Annotated[
        str, typer.Option("--profile", "-p", help="Profile CSV or shipped profile name.")
    ],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="PNG path (default PLAN.png).")
    ] = None,
    allow_implausible_power: AllowImplausiblePower = False,
) -> None:
    """Per-stage Gantt chart of one iteration, coloured by SM frequency."""
    from perseus.io.plan_file import load_plan
    from perseus.io.profile_csv import load_profile
    from perseus.plotting import plot_timeline

    prof = load_profile(resolve_profile_path(profile), check_power=not allow_implausible_power)
    typer.echo(str(plot_timeline(prof, load_plan(plan), out or plan.with_suffix(".png"))))
