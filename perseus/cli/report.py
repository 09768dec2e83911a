"""`perseus report DUMP_DIR/JOB_ID`: what a job saved, from its dump.

Prints the energy report `perseus.planning.dump.read_dump` makes from the job's files — the
same accounting as the coordinator's ``GET /jobs/{job_id}`` — then draws the rounds (PNG).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from perseus.cli._common import AllowImplausiblePower, cli_errors, console

if TYPE_CHECKING:
    pass

__all__ = ["report"]


def _pct(value: float | None) -> str:
    return "unknown" if value is None else f"{100 * value:+.1f} %"


@cli_errors
def report(
    job_dir: Annotated[Path, typer.Argument(help="A job's dump: DUMP_DIR/JOB_ID.")],
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="PNG path (default DUMP_DIR/JOB_ID/energy_report.png)."),
    ] = None,
    profile: Annotated[
        Path | None,
        typer.Option(
            "--profile",
            "-p",
            help="Profile CSV for the predicted all-max baseline (default: the job's swept "
            "profile, else the profile_path it was given).",
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the report as JSON (no table).")
    ] = False,
    allow_implausible_power: AllowImplausiblePower = False,
) -> None:
    """A job's energy report: measured saving and slowdown of its deployed plan against its
    all-max rounds, the plan's predictions beside them; writes a plot of every round."""
    from rich.table import Table

    from perseus.planning.dump import read_dump
    from perseus.plotting import plot_energy_report

    dump = read_dump(job_dir, profile=profile, check_power=not allow_implausible_power)
    rep = dump.report
    predicted = {
        kind: (f.iteration_time_s, f.energy_j)
        for kind, f in (("all-max", rep.predicted_all_max), ("deployed", rep.predicted_deployed))
        if f is not None
    }
    png = plot_energy_report(
        dump.rounds,
        predicted,
        out or job_dir / "energy_report.png",
        title=f"{dump.job_id} ({dump.scheduler})",
    )
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "job_id": dump.job_id,
                    "plot": str(png),
                    **rep.model_dump(),
                    "promise": dump.promise,
                }
            )
        )
        return
    table = Table(title=f"Job {dump.job_id} ({dump.scheduler}): per iteration, all GPUs")
    for col in ("", "time (s)", "energy (J)"):
        table.add_column(col, justify="right" if col else "left")
    rows = (
        ("measured, all-max", rep.measured_all_max),
        ("measured, deployed plan", rep.measured_deployed),
        ("predicted, all-max", rep.predicted_all_max),
        ("predicted, deployed plan", rep.predicted_deployed),
    )
    for name, f in rows:
        if f is None:
            table.add_row(name, "unknown", "unknown")
        else:
            table.add_row(name, f"{f.iteration_time_s:.4f}", f"{f.energy_j:.1f}")
    console.print(table)
    decisive = [e for e in dump.promise if e["event"] != "check"]
    for e in decisive[-10:]:
        console.print(f"round {e.get('round', '?')}: {e['event']}: {e.get('reason', '')}")
    console.print(
        f"Energy saving: measured {_pct(rep.measured_saving)}, predicted "
        f"{_pct(rep.predicted_saving)}; slowdown: measured {_pct(rep.measured_slowdown)}, "
        f"predicted {_pct(rep.predicted_slowdown)} ({len(dump.rounds)} measured rounds)"
    )
    typer.echo(str(png))
