"""The `perseus` command line."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Annotated

import typer

from perseus.cli import demo as _demo
from perseus.cli import gpud as _gpud
from perseus.cli import plot as _plot
from perseus.cli import profile as _profile
from perseus.cli import report as _report
from perseus.cli import serve as _serve
from perseus.cli import solve as _solve
from zeus_power import cli as _bso

app = typer.Typer(
    name="perseus",
    help="Perseus: time–energy frontiers and per-instruction GPU frequency plans for pipeline training.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
DISTRIBUTION = "perseus-energy"
"""The name the project is installed under (`pip show perseus-energy`)."""


def package_version() -> str:
    """The installed version, or a note that this checkout is not installed."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"perseus {package_version()}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print the installed version and exit.",
        ),
    ] = False,
) -> None:
    """Perseus: time–energy frontiers and per-instruction GPU frequency plans for pipeline training."""


app.command("solve")(_solve.solve)
app.command("evaluate")(_solve.evaluate_plan)
app.command("choose")(_solve.choose)
app.command("polish")(_solve.polish)
app.add_typer(_plot.app, name="plot")
app.command("serve")(_serve.serve)
app.command("report")(_report.report)
app.command("demo")(_demo.demo)
app.command("gpud")(_gpud.gpud)
app.add_typer(_profile.app, name="profile")
app.add_typer(_bso.app, name="bso", help="The batch-size optimizer service (Zeus).")

__all__ = ["app"]
