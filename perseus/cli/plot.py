"""`perseus plot frontier` and `perseus plot timeline`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from perseus.cli._common import AllowImplausiblePower, cli_errors, resolve_profile_path

app = typer.Typer(
    help="Draw the frontier or a plan's per-stage timeline as PNG.", no_args_is_help=True
)


@app.command("frontier")
@cli_errors
def frontier(
    frontier_dir: Annotated[Path, typer.Argument(help="Directory written by `perseus solve`.")],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="PNG path (default DIR/frontier.png).")
    ] = None,
) -> None:
    """Energy vs iteration time of every frontier plan, with the LP lower bound."""
    from perseus.plotting import plot_frontier

    typer.echo(str(plot_frontier(frontier_dir, out)))  # a path: never wrapped


@app.command("timeline")
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
