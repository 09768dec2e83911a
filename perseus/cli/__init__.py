"""The `perseus` command line."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

import typer
import typer.main
from typer.core import TyperGroup

from perseus.cli import demo as _demo
from perseus.cli import gpud as _gpud
from perseus.cli import plans as _plans
from perseus.cli import plot as _plot
from perseus.cli import profile as _profile
from perseus.cli import report as _report
from perseus.cli import serve as _serve
from perseus.cli import solve as _solve
from zeus_power import cli as _bso


class PerseusGroup(TyperGroup):
    """The command group; ``serve`` is built when asked for: its flags come from every
    scheduler's argument model, and importing the schedulers costs a second that the other
    commands (``gpud`` runs as root) never pay."""

    LAZY_BEFORE: ClassVar[dict[str, str]] = {"serve": "report"}
    """Lazily built command → the command it is listed before."""
    _built: ClassVar[dict[str, Any]] = {}

    def list_commands(self, ctx: Any) -> list[str]:
        names = [n for n in super().list_commands(ctx) if n not in self.LAZY_BEFORE]
        for name, before in self.LAZY_BEFORE.items():
            names.insert(names.index(before) if before in names else len(names), name)
        return names

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name == "serve":
            if "serve" not in self._built:
                from perseus.cli.scheduler_flags import command_with_flags

                single = typer.Typer(rich_markup_mode=None, add_completion=False)
                single.command(
                    "serve",
                    short_help="Run the coordinator (the scheduler and its arguments as flags).",
                )(command_with_flags(_serve.serve))
                self._built["serve"] = typer.main.get_command(single)
            return self._built["serve"]
        return super().get_command(ctx, cmd_name)


app = typer.Typer(
    cls=PerseusGroup,
    name="perseus",
    help="Perseus: time–energy frontiers and per-instruction GPU frequency plans for pipeline training.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    # Click's own help layout: it wraps long option names and texts at any width (rich's
    # tables cut them at 80 columns).
    rich_markup_mode=None,
)
app.command(
    "solve", short_help="Solve a profile's whole time-energy frontier; one plan per point."
)(_solve.solve)
app.command("evaluate", short_help="Score a plan exactly against a profile (JSON).")(
    _plans.evaluate_plan
)
app.command("choose", short_help="The cheapest frontier plan within a slowdown or a deadline.")(
    _plans.choose
)
app.command("polish", short_help="Lower one plan's energy at no longer iteration time.")(
    _plans.polish
)
DISTRIBUTION = "perseus-energy"
"""The name the project is installed under (`pip show perseus-energy`)."""


def package_version() -> str:
    """The installed version, or a note that this checkout is not installed."""
    from importlib.metadata import PackageNotFoundError, version  # 12 ms: only when asked

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


app.add_typer(_plot.app, name="plot")
app.command("report", short_help="A job's measured and predicted saving, from its dump.")(
    _report.report
)
app.command("demo", short_help="The whole Perseus loop on 4 emulated GPUs, against all-max.")(
    _demo.demo
)
app.command("gpud", short_help="Serve GPU clock and power-limit changes to unprivileged jobs.")(
    _gpud.gpud
)
app.add_typer(_profile.app, name="profile", short_help="Make instruction profiles.")
app.add_typer(_bso.app, name="bso", help="The batch-size optimizer service (Zeus).")

__all__ = ["app"]
