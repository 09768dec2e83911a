"""Shared CLI plumbing: one place where domain errors become a clean message and exit 2."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, ParamSpec, TypeVar

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from perseus.errors import PerseusError

__all__ = [
    "AllowImplausiblePower",
    "cli_errors",
    "console",
    "err_console",
    "estimates_note",
    "fraction_progress",
    "narrow_table",
    "resolve_profile_path",
]

AllowImplausiblePower = Annotated[
    bool,
    typer.Option(
        "--allow-implausible-power",
        help="Accept profile rows whose power (energy / time) is outside 1 W..2 kW; by "
        "default they are refused as a unit mistake (times in ms, energies in mJ).",
    ),
]
"""The option every command that reads a profile takes to skip the unit check."""

console = Console()
err_console = Console(stderr=True)


def fraction_progress(verb: str) -> Progress:
    """A transient progress bar for work that reports the fraction done (0..1)."""
    return Progress(
        TextColumn(f"[bold]{verb}[/] {{task.description}}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


def narrow_table(
    title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], *, caption: str = ""
) -> Table:
    """A table that fits 80 columns: light rules, no outer padding, one-word headers (units
    and meanings go in `caption`) and cells (a name, then right-aligned numbers) that are
    never wrapped or cut."""
    table = Table(title=title, caption=caption or None, box=box.MINIMAL, pad_edge=False)
    for i, name in enumerate(headers):
        table.add_column(name, justify="left" if i == 0 else "right", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    return table


P = ParamSpec("P")
R = TypeVar("R")


def _known_errors() -> tuple[type[BaseException], ...]:
    # OSError: a missing file, no permission, an --out that is a file, a full disk, ...
    # ZeusError: zeus_power's root, the device layer's GPUError included.
    from zeus_power.errors import ZeusError

    return (PerseusError, ZeusError, OSError)


def cli_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Print expected errors as one red line on stderr and exit with status 2 (no traceback)."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except _known_errors() as exc:
            err_console.print(
                f"[bold red]Error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True
            )
            raise typer.Exit(2) from None

    return wrapper


def resolve_profile_path(value: str) -> Path:
    """A profile argument: a CSV path, or the name of a profile shipped in `perseus/profiles/`."""
    path = Path(value)
    if path.is_file():
        return path
    if path.suffix in ("", ".csv") and path.parent == Path("."):
        from perseus import profiles

        try:
            return profiles.path(value)
        except FileNotFoundError:
            pass
    from perseus import profiles

    shipped = ", ".join(profiles.available()) or "none"
    raise FileNotFoundError(
        f"Profile {value!r} is neither a file nor a shipped profile (shipped: {shipped})"
    )


EMULATED_NOTE = (
    "Profile measured on emulated GPUs: its times and energies are the emulator's model, "
    'not measurements; the plans written from it say "emulated": true'
)
"""What the commands that read a profile print when its rows are marked emulated."""


def estimates_note(estimates: tuple[int, int, float, float] | None) -> str | None:
    """What a command prints when a profile's energies were estimated from aggregate
    readings (its ``method`` column; `InstructionProfile.estimates`): how many, and how
    sure (None: all measured)."""
    if estimates is None:
        return None
    n, total, median, worst = estimates
    return (
        f"{n} of {total} profile options have energies estimated from aggregate readings "
        "(the GPUs' energy counters over many instructions), not measured one by one: "
        f"standard error median {100 * median:.2f} %, worst {100 * worst:.2f} % of the "
        "energy. The plans rest on these estimates."
    )
