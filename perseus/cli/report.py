"""`perseus report DUMP_DIR/JOB_ID`: what a job saved, from its dump.

Reads the job's record, ranks, every round's schedules and results and its deployed plan
(`perseus.io.jobdir.JobDir` names them), classifies each round (all-max, deployed, other)
and prints the energy report of `perseus.planning.report` — the same accounting as the
coordinator's ``GET /jobs/{job_id}`` — then draws the rounds (PNG).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from pydantic import ValidationError

from perseus.cli._common import AllowImplausiblePower, cli_errors, console
from perseus.errors import PerseusError

if TYPE_CHECKING:
    from perseus.domain.plan import Plan
    from perseus.planning.report import EnergyReport, IterationFigures, RoundKind

__all__ = ["DumpReport", "read_dump", "report"]

_MAX_ROUNDS = 100_000


@dataclass
class DumpReport:
    """A job's rounds (round, kind, time s, energy J per iteration) and its energy report."""

    job_id: str
    scheduler: str
    rounds: list[tuple[int, str, float, float]]
    report: EnergyReport


def _predicted_baseline(
    job_dir: Path, plan: Plan, profile: Path | None, check: bool, meta: dict[str, object]
) -> Plan | None:
    """The all-max plan scored by the model that scored `plan`: as the coordinator wrote it
    (``baseline_plan.json``), else re-scored on the job's profile at the plan's own switching
    and hop latencies (None without a profile)."""
    from perseus.io.jobdir import JobDir
    from perseus.io.plan_file import load_plan
    from perseus.io.profile_csv import load_profile
    from perseus.planning import make_plan, max_frequencies

    jd = JobDir(job_dir)
    if profile is None and jd.baseline_plan.is_file():
        return load_plan(jd.baseline_plan)
    if profile is None:
        if jd.profile.is_file():
            profile = jd.profile
        else:
            args = meta.get("scheduler_args")
            given = args.get("profile_path") if isinstance(args, dict) else None
            if isinstance(given, str) and Path(given).is_file():
                profile = Path(given)
    if profile is None:
        return None
    prof = load_profile(profile, check_power=check)
    schedule = plan.pipeline_schedule()
    return make_plan(
        prof,
        schedule,
        max_frequencies(prof, schedule),
        plan.p2p_power,
        switch_latency_s=plan.switch_latency,
        hop_latency_s=plan.hop_latency,
    )


def read_dump(
    job_dir: Path, *, profile: Path | None = None, check_power: bool = True
) -> DumpReport:
    """Read a job's dump; `PerseusError` naming the file that is missing or malformed."""
    from perseus.io.jobdir import JobDir
    from perseus.io.plan_file import load_plan
    from perseus.planning.report import (
        EnergyReport,
        measure,
        median_of_rounds,
        predicted_figures,
        round_kind,
    )
    from perseus.protocol import JobRecord, load_prof, load_ranks, load_sched

    jd = JobDir(job_dir)
    if not jd.job.is_file():
        raise PerseusError(
            f"{str(job_dir)!r} is not a job's dump: it has no {JobDir.JOB} (give DUMP_DIR/JOB_ID)"
        )
    current = jd.job
    try:
        record = JobRecord.model_validate_json(jd.job.read_text())
        current = jd.scheduler
        meta = json.loads(jd.scheduler.read_text()) if jd.scheduler.is_file() else {}
        if not isinstance(meta, dict):
            raise ValueError("not a JSON object")
        scheduler = str(meta.get("scheduler", "unknown scheduler")).replace(":", ".")
        scheduler = scheduler.rsplit(".", 1)[-1]
        current = jd.ranks
        ranks = load_ranks(jd.path) if jd.ranks.is_file() else []
        current = jd.deployed_plan
        plan = load_plan(jd.deployed_plan) if jd.deployed_plan.is_file() else None
        max_freq = {r.rank: max(r.available_frequencies) for r in ranks}
        pp_rank = {r.rank: r.pp_rank for r in ranks}
        rounds: list[tuple[int, str, float, float]] = []
        measured: list[tuple[int, RoundKind, IterationFigures]] = []
        numbers = jd.rounds()
        if len(numbers) > _MAX_ROUNDS:
            raise PerseusError(f"{job_dir} holds {len(numbers):,} rounds; at most {_MAX_ROUNDS:,}")
        for n in numbers:
            if not jd.results(n).is_file():
                continue
            current = jd.schedules(n)
            kind = round_kind(load_sched(jd.path, n), max_freq=max_freq, pp_rank=pp_rank, plan=plan)
            current = jd.results(n)
            figures = measure(load_prof(jd.path, n))
            if figures is None:
                continue
            rounds.append((n, kind.value, figures.iteration_time_s, figures.energy_j))
            measured.append((n, kind, figures))
        current = jd.path
        baseline = (
            _predicted_baseline(jd.path, plan, profile, check_power, meta)
            if plan is not None
            else None
        )
    except (ValidationError, ValueError, json.JSONDecodeError) as exc:
        raise PerseusError(f"{current} is malformed: {exc}") from None

    dp = record.dp_degree
    all_max, deployed = median_of_rounds(
        measured,
        plan_is_all_max=(
            plan is not None and baseline is not None and plan.frequencies == baseline.frequencies
        ),
    )
    report_ = EnergyReport.of(
        measured_all_max=all_max,
        measured_deployed=deployed,
        predicted_all_max=predicted_figures(baseline, dp) if baseline is not None else None,
        predicted_deployed=predicted_figures(plan, dp) if plan is not None else None,
    )
    return DumpReport(record.job_id, scheduler, rounds, report_)


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
        typer.echo(json.dumps({"job_id": dump.job_id, "plot": str(png), **rep.model_dump()}))
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
    console.print(
        f"Energy saving: measured {_pct(rep.measured_saving)}, predicted "
        f"{_pct(rep.predicted_saving)}; slowdown: measured {_pct(rep.measured_slowdown)}, "
        f"predicted {_pct(rep.predicted_slowdown)} ({len(dump.rounds)} measured rounds)"
    )
    typer.echo(str(png))
