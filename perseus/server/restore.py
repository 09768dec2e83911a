"""Reading back what a previous coordinator dumped for one job, trusting nothing.

A dump it cannot trust is refused (`ConfigurationError`, naming the file) and left as it
is, never imported or re-interpreted: an unreadable or inconsistent ``job.json``,
``ranks.json``, ``ranks.partial.jsonl`` or ``deployed_plan.json``; a missing or corrupted
``scheduler.json``; a ``scheduler.json`` naming another scheduler than the one this
coordinator runs (compared as text, before anything is imported) or arguments that
scheduler refuses. `perseus.server.job_manager.JobManager.reload` builds the jobs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perseus.domain.plan import Plan
from perseus.errors import ConfigurationError, PerseusError
from perseus.io.jobdir import JobDir
from perseus.io.model_files import load_models
from perseus.io.plan_file import load_plan
from perseus.planning.report import measure, round_kind
from perseus.protocol import FrequencySchedule, JobRecord, ProfilingResult, RankInfo
from perseus.schedulers.base import check_scheduler_args
from perseus.schedulers.registry import scheduler_ref

if TYPE_CHECKING:
    from perseus.server.job import CoordinatedJob

__all__ = ["DumpedJob", "read_dump", "restore_report_rounds", "trusted_scheduler"]

_MAX_META_BYTES = 1 << 20
"""``scheduler.json`` is a name and a few arguments: anything larger is not ours."""
_MAX_RANK_LINE_BYTES = 64 << 10
"""A RankInfo line: a few ranks and at most a few thousand frequencies."""


@dataclass(frozen=True)
class DumpedJob:
    """What a job's dump holds, checked."""

    info: JobRecord
    scheduler_args: dict[str, Any]
    ranks: list[RankInfo]
    """The talking ranks registered so far (all of them when `complete`)."""
    plan: Plan | None
    """The deployed plan (only when `complete`)."""

    @property
    def complete(self) -> bool:
        return len(self.ranks) == self.info.talking_ranks


def read_dump(job_dir: JobDir, scheduler_cls: type) -> DumpedJob:
    """The dump of `job_dir`, if this coordinator (running `scheduler_cls`) can trust it."""
    try:
        info = JobRecord.model_validate_json(job_dir.job.read_bytes())
    except ValueError as exc:
        raise ConfigurationError(f"{job_dir.job.name} is not a valid job record: {exc}") from None
    if info.job_id != job_dir.name:
        raise ConfigurationError(
            f"{job_dir.job.name} is the record of job {info.job_id!r}, not of {job_dir.name!r}"
        )
    args = trusted_scheduler(job_dir, scheduler_cls)
    rank_infos: list[RankInfo] = []
    if job_dir.ranks.is_file():
        try:
            rank_infos = load_models(job_dir.ranks, RankInfo)
        except ValueError as exc:
            raise ConfigurationError(f"{job_dir.ranks.name} is not valid: {exc}") from None
        _check_restored_ranks(job_dir, info, rank_infos)
    elif job_dir.registering.is_file():
        rank_infos = _registered_so_far(job_dir, info)
    complete = len(rank_infos) == info.talking_ranks
    plan = None
    if complete and job_dir.deployed_plan.is_file():
        try:
            plan = load_plan(job_dir.deployed_plan)
        except (ValueError, PerseusError) as exc:
            raise ConfigurationError(
                f"{job_dir.deployed_plan.name} is not a valid plan: {exc}"
            ) from None
    return DumpedJob(info, args, rank_infos, plan)


def trusted_scheduler(job_dir: JobDir, scheduler_cls: type) -> dict[str, Any]:
    """The job's scheduler arguments, if its ``scheduler.json`` names this coordinator's
    scheduler; `ConfigurationError` otherwise. Nothing is imported."""
    path = job_dir.scheduler
    if not path.is_file():
        raise ConfigurationError(
            f"{path.name} is missing: the job's scheduler is unknown (not restored with "
            f"{scheduler_cls.__name__} in its place)"
        )
    if path.stat().st_size > _MAX_META_BYTES:
        raise ConfigurationError(f"{path.name} is larger than {_MAX_META_BYTES} bytes")
    try:
        meta = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"{path.name} is not valid JSON: {exc}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("scheduler"), str):
        raise ConfigurationError(f"{path.name} has no scheduler name")
    expected = scheduler_ref(scheduler_cls)
    if meta["scheduler"] != expected:
        raise ConfigurationError(
            f"{path.name} names scheduler {meta['scheduler'][:200]!r}, but this "
            f"coordinator runs {expected!r} (PERSEUS_SCHEDULER); start a coordinator "
            "with that scheduler to restore it"
        )
    args = meta.get("scheduler_args", {})
    if not isinstance(args, dict):
        raise ConfigurationError(f"{path.name}: scheduler_args is not a JSON object")
    check_scheduler_args(scheduler_cls, args)
    return args


def restore_report_rounds(job: CoordinatedJob, rounds: list[int], plan: Any) -> None:
    """A restored job's latest dumped all-max and deployed rounds: kept from pruning again,
    and the energy report's measurements (worker thread: reads a few small files)."""
    max_freq = {r: max(i.available_frequencies) for r, i in job.ranks.items()}
    pp_rank = {r: i.pp_rank for r, i in job.ranks.items()}
    for number in rounds:
        try:
            kind = round_kind(
                load_models(job.dir.schedules(number), FrequencySchedule),
                max_freq=max_freq,
                pp_rank=pp_rank,
                plan=plan,
            )
        except (OSError, ValueError):
            continue  # pruned meanwhile, or torn: it was not a report round
        if kind not in job.rounds.report_rounds:
            continue
        job.rounds.report_rounds[kind].append(number)
        try:
            figures = measure(load_models(job.dir.results(number), ProfilingResult))
        except (OSError, ValueError):
            continue
        if figures is not None:
            job.stats.restore(number, kind, figures)


def _not_its_leader(info: JobRecord, rank: RankInfo) -> bool:
    """Whether `rank` cannot be a talking rank of job `info` (protocol 2: not a leader, or
    not speaking for its block; protocol 1: speaking for others)."""
    leaders = info.leaders
    if leaders is None:
        return rank.replicas is not None
    if not leaders.is_leader(dp_rank=rank.dp_rank, tp_rank=rank.tp_rank):
        return True
    return rank.replicas != list(leaders.block(rank.dp_rank))


def _check_restored_ranks(job_dir: JobDir, info: JobRecord, rank_infos: list[RankInfo]) -> None:
    """``ranks.json`` must hold every talking rank of the job once: ranks 0..world_size − 1
    (protocol 1), or one leader per stage and leader replica (protocol 2)."""
    name = job_dir.ranks.name
    leaders = info.leaders
    if leaders is None:
        if sorted(r.rank for r in rank_infos) != list(range(info.world_size)):
            raise ConfigurationError(
                f"{name} does not hold ranks 0..{info.world_size - 1} once each"
            )
    else:
        places = sorted((r.pp_rank, r.dp_rank) for r in rank_infos)
        expected = sorted((p, d) for p in range(info.pp_degree) for d in leaders.replicas)
        if places != expected or len({r.rank for r in rank_infos}) != len(rank_infos):
            raise ConfigurationError(
                f"{name} does not hold the job's {leaders.count} leader(s) once each"
            )
    for rank in rank_infos:
        bad = info.layout.out_of_range(
            rank=rank.rank, dp_rank=rank.dp_rank, pp_rank=rank.pp_rank, tp_rank=rank.tp_rank
        )
        if bad is not None or _not_its_leader(info, rank):
            raise ConfigurationError(f"{name}: rank {rank.rank} is not a talking rank of the job")


def _registered_so_far(job_dir: JobDir, info: JobRecord) -> list[RankInfo]:
    """The ranks of ``ranks.partial.jsonl`` (a job killed while its ranks registered).

    A last line without its newline was being written when the coordinator died: that rank
    never heard back and registers again, so it is skipped. Anything else that is not a
    valid, distinct rank of the job makes the dump untrusted.
    """
    path = job_dir.registering
    if path.stat().st_size > info.world_size * _MAX_RANK_LINE_BYTES:
        raise ConfigurationError(f"{path.name} is larger than {info.world_size} ranks can be")
    text = path.read_text(encoding="utf-8", errors="replace")
    # What follows the last newline is empty, or torn (being written when it was killed).
    lines = text.split("\n")[:-1]
    ranks: dict[int, RankInfo] = {}
    coords: set[tuple[int, int, int]] = set()
    for number, line in enumerate(lines, 1):
        try:
            rank = RankInfo.model_validate_json(line)
        except ValueError as exc:
            raise ConfigurationError(f"{path.name} line {number} is not valid: {exc}") from None
        where = (rank.dp_rank, rank.pp_rank, rank.tp_rank)
        if (
            not 0 <= rank.rank < info.world_size
            or rank.rank in ranks
            or where in coords
            or info.layout.out_of_range(
                rank=rank.rank, dp_rank=rank.dp_rank, pp_rank=rank.pp_rank, tp_rank=rank.tp_rank
            )
            is not None
            or _not_its_leader(info, rank)
        ):
            raise ConfigurationError(
                f"{path.name} line {number}: rank {rank.rank} at {where} is not a new rank of "
                f"job {info.job_id}"
            )
        ranks[rank.rank] = rank
        coords.add(where)
    return [ranks[r] for r in sorted(ranks)]
