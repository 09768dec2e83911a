"""A job's energy report from its dump: what `perseus report` and `perseus demo` print.

Reads the job's record, ranks, every round's schedules and results, its deployed plan and
its predicted baseline (`perseus.io.jobdir.JobDir` names them), classifies each round
(all-max, deployed, other) and makes the energy report of `perseus.planning.report` — the
same accounting as the coordinator's ``GET /jobs/{job_id}``.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from perseus.errors import PerseusError

if TYPE_CHECKING:
    from perseus.domain.plan import Plan
    from perseus.io.jobdir import JobDir
    from perseus.planning.report import EnergyReport, IterationFigures, RoundKind

__all__ = ["DumpReport", "read_dump"]

_MAX_ROUNDS = 100_000


@dataclass
class DumpReport:
    """A job's rounds (round, kind, time s, energy J per iteration) and its energy report."""

    job_id: str
    scheduler: str
    rounds: list[tuple[int, str, float, float]]
    report: EnergyReport
    promise: list[dict[str, Any]] = field(default_factory=list)
    """The scheduler's deployments, checks and moves (``promise.jsonl``), oldest first."""
    estimates: tuple[int, int, float, float] | None = None
    """`InstructionProfile.estimates` of the job's profile: how many of its options were
    estimated from aggregate readings, how sure (None: all measured, or no profile)."""


def _profile_path(jd: JobDir, profile: Path | None, meta: dict[str, object]) -> Path | None:
    """The profile a report uses: the one given, else the job's swept profile, else the
    ``profile_path`` the job was given."""
    if profile is not None:
        return profile
    if jd.profile.is_file():
        return jd.profile
    args = meta.get("scheduler_args")
    given = args.get("profile_path") if isinstance(args, dict) else None
    return Path(given) if isinstance(given, str) and Path(given).is_file() else None


def _predicted_baseline(
    job_dir: Path, plan: Plan, profile: Path | None, check: bool, meta: dict[str, object]
) -> Plan | None:
    """The all-max plan scored by the model that scored `plan`: as the coordinator wrote it
    (``baseline_plan.json``), else re-scored on the job's profile at the plan's own switching
    and hop latencies (None without a profile)."""
    from perseus.io.jobdir import JobDir
    from perseus.io.plan_file import load_plan
    from perseus.io.profile_csv import load_profile
    from perseus.planning import all_max_plan

    jd = JobDir(job_dir)
    if profile is None and jd.baseline_plan.is_file():
        return load_plan(jd.baseline_plan)
    profile = _profile_path(jd, profile, meta)
    if profile is None:
        return None
    prof = load_profile(profile, check_power=check)
    return all_max_plan(
        prof,
        plan.pipeline_schedule(),
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
    from perseus.io.profile_csv import load_profile
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
        used = _profile_path(jd, profile, meta)
        current = used if used is not None else jd.path
        estimates = (
            load_profile(used, check_power=check_power).estimates() if used is not None else None
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
    return DumpReport(
        record.job_id,
        scheduler,
        rounds,
        report_,
        _promise(jd.promise_before, jd.promise),
        estimates,
    )


_MAX_EVENTS = 10_000


def _promise(*paths: Path) -> list[dict[str, Any]]:
    """The events of ``promise.1.jsonl`` and ``promise.jsonl`` (none when absent), the
    newest `_MAX_EVENTS`, oldest first; a line that is not a JSON object with an ``event``
    is skipped (the file is the scheduler's, written as it goes)."""
    events: deque[dict[str, Any]] = deque(maxlen=_MAX_EVENTS)
    for path in paths:
        if not path.is_file():
            continue
        with path.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(entry, dict) and isinstance(entry.get("event"), str):
                    events.append(entry)
    return list(events)
