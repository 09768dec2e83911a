"""All jobs of one coordinator: registration, idle eviction, and restoring the jobs a
previous coordinator persisted under `dump_dir` (one job: `perseus.server.job`).

Restoring (`JobManager.reload`, before the server accepts a connection) brings back every
live job: its record as stored (credentials included), its scheduler with the arguments it
was registered with, its ranks, its round number (the last dumped round + 1) and its
deployed plan (`FrequencyScheduler.resume`) and the rounds its energy report is made from
(its latest dumped all-max and deployed rounds, kept from pruning). Evicted, failed and
finished jobs (their marker files) stay down. A dump it cannot trust is refused with a warning and left as it is, never
imported or re-interpreted: an unreadable or inconsistent ``job.json``, ``ranks.json`` or
``deployed_plan.json``; a missing or corrupted ``scheduler.json``; a ``scheduler.json``
naming another scheduler than the one this coordinator runs (compared as text, before
anything is imported) or arguments that scheduler refuses.

A job that ends (fails or finishes) stays listed, with its state, for `ended_job_ttl_s`
seconds (``/jobs``, its ``/metrics`` series); then it is forgotten. An evicted job is
removed at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import Callable
from typing import Any

from perseus.errors import (
    ConfigurationError,
    CoordinatorBusyError,
    InvalidJobError,
    PerseusError,
    ScheduleError,
    SolverError,
    UnknownJobError,
)
from perseus.io.atomic import atomic_write_text
from perseus.io.jobdir import JobDir
from perseus.io.plan_file import load_plan
from perseus.planning.report import measure, round_kind
from perseus.protocol import (
    JobInfo,
    JobRecord,
    RankInfo,
    load_prof,
    load_ranks,
    load_sched,
)
from perseus.server.job import CoordinatedJob, JobPhase
from perseus.settings import PerseusSettings
from schedulers.base import build_scheduler, check_scheduler_args
from schedulers.registry import scheduler_ref

__all__ = ["JobManager", "UntrustedDumpError"]

logger = logging.getLogger(__name__)

_METADATA = re.compile(r"[A-Za-z0-9._+-]{1,64}")
_MAX_META_BYTES = 1 << 20
"""``scheduler.json`` is a name and a few arguments: anything larger is not ours."""
_MAX_RANK_LINE_BYTES = 64 << 10
"""A RankInfo line: a few ranks and at most a few thousand frequencies."""


class UntrustedDumpError(ConfigurationError):
    """A job's dump cannot be trusted: the job is not restored."""


class JobManager:
    """All jobs of one coordinator (kept on ``app.state.job_manager``)."""

    def __init__(
        self, settings: PerseusSettings, scheduler_cls: type, *, round_timeout_s: float = 120.0
    ) -> None:
        if not round_timeout_s > 0:
            raise ValueError(f"round_timeout_s must be positive, got {round_timeout_s!r}")
        self.settings = settings
        self.scheduler_cls = scheduler_cls
        """The class `settings.scheduler` names (resolved by `create_app`)."""
        self.round_timeout_s = round_timeout_s
        self.jobs: dict[str, CoordinatedJob] = {}
        self.round_listeners: list[Callable[[CoordinatedJob, float], None]] = []
        """Called with (job, latency in s) whenever a job hands out a round (metrics)."""
        self.end_listeners: list[Callable[[CoordinatedJob, str], None]] = []
        """Called with (job, "failed" | "finished" | "evicted") when a job ends (metrics)."""
        self._forget_timers: dict[str, asyncio.TimerHandle] = {}

    def get(self, job_id: str) -> CoordinatedJob:
        try:
            return self.jobs[job_id]
        except KeyError:
            raise UnknownJobError(
                f"Unknown job id {job_id!r}: register the job first (POST /register_job); "
                "jobs idle longer than max_job_idle_time are evicted",
                job_id=job_id,
            ) from None

    def _new_job(
        self, record: JobRecord, scheduler_cls: type, args: dict[str, Any]
    ) -> CoordinatedJob:
        job = CoordinatedJob(
            record,
            self.settings,
            scheduler_cls=scheduler_cls,
            scheduler_args=args,
            round_timeout_s=self.round_timeout_s,
        )
        job.on_round = self._on_round
        job.on_end = self._on_end
        self.jobs[job.job_id] = job
        return job

    def _on_round(self, job: CoordinatedJob, latency_s: float) -> None:
        for listener in self.round_listeners:
            listener(job, latency_s)

    def _on_end(self, job: CoordinatedJob) -> None:
        """A job failed or finished: tell the listeners, forget it `ended_job_ttl_s` later."""
        for listener in self.end_listeners:
            listener(job, job.phase.value)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # pragma: no cover - jobs end on the event loop
            return
        old = self._forget_timers.pop(job.job_id, None)
        if old is not None:
            old.cancel()
        self._forget_timers[job.job_id] = loop.call_later(
            self.settings.ended_job_ttl_s, self._forget, job
        )

    def _forget(self, job: CoordinatedJob) -> None:
        """Drop an ended job (its dump stays); later if a round is still being computed."""
        self._forget_timers.pop(job.job_id, None)
        if self.jobs.get(job.job_id) is not job:
            return
        if job.busy:
            self._forget_timers[job.job_id] = asyncio.get_running_loop().call_later(
                1.0, self._forget, job
            )
            return
        del self.jobs[job.job_id]
        logger.info(
            "Forgot job %s (%s %g s ago)",
            job.job_id,
            job.phase.value,
            self.settings.ended_job_ttl_s,
        )

    async def create_job(self, info: JobInfo, *, token_sha256: str | None = None) -> str:
        """Register a job; returns its new id. `token_sha256`: the hash of the credential
        its ranks will present (stored with the job, dumped in ``job.json``).

        Raises:
            InvalidJobError: (422) bad metadata, a world size over `max_world_size`, or a
                job the scheduler cannot run.
            CoordinatorBusyError: (503) `max_jobs` jobs are live already.
        """
        if info.world_size > self.settings.max_world_size:
            raise InvalidJobError(
                f"world_size {info.world_size} is over this coordinator's limit of "
                f"{self.settings.max_world_size} ranks (PERSEUS_MAX_WORLD_SIZE)"
            )
        live = sum(1 for job in self.jobs.values() if not job.phase.ended)
        if live >= self.settings.max_jobs:
            raise CoordinatorBusyError(
                f"This coordinator already runs {live} live jobs, its limit "
                "(PERSEUS_MAX_JOBS): try again when one has ended or been evicted"
            )
        if info.job_metadata and not _METADATA.fullmatch(info.job_metadata):
            raise InvalidJobError(
                f"job_metadata {info.job_metadata!r} becomes part of the job id (a URL path "
                "segment and a folder name): use letters, digits and . _ - + only, "
                "at most 64 characters"
            )
        try:
            checked = check_scheduler_args(self.scheduler_cls, self.settings.scheduler_args)
            self.scheduler_cls.check_job(info, checked)
        except (ConfigurationError, ScheduleError, SolverError) as exc:
            raise InvalidJobError(str(exc)) from None
        record = JobRecord.register(info, self.scheduler_cls.__name__, token_sha256=token_sha256)
        job = self._new_job(record, self.scheduler_cls, self.settings.scheduler_args)
        if job.dumping:
            meta = {
                "scheduler": scheduler_ref(self.scheduler_cls),
                "scheduler_args": self.settings.scheduler_args,
            }
            await job._dump(
                asyncio.to_thread(atomic_write_text, job.dir.job, record.model_dump_json() + "\n")
            )
            await job._dump(
                asyncio.to_thread(atomic_write_text, job.dir.scheduler, json.dumps(meta) + "\n")
            )
        logger.info(
            "Registered job %s (world_size %d, %d talking rank(s), protocol %d)",
            record.job_id,
            record.world_size,
            record.talking_ranks,
            record.protocol_version,
        )
        return record.job_id

    def evict_idle(self, *, now: float | None = None) -> list[str]:
        """Remove jobs idle longer than `max_job_idle_time`; returns their ids."""
        now = time.monotonic() if now is None else now
        evicted = []
        for job_id, job in list(self.jobs.items()):
            if job.busy or now - job.last_active <= self.settings.max_job_idle_time:
                continue
            del self.jobs[job_id]
            timer = self._forget_timers.pop(job_id, None)
            if timer is not None:
                timer.cancel()
            job.close(UnknownJobError(f"Job {job_id} was evicted (idle)", job_id=job_id))
            if job.dumping and job.dir.path.is_dir() and not job.phase.ended:
                with contextlib.suppress(OSError):
                    job.dir.evicted.write_text("idle\n")
            if not job.phase.ended:
                for listener in self.end_listeners:
                    listener(job, "evicted")
            evicted.append(job_id)
            logger.info("Evicted job %s (idle %.0f s)", job_id, now - job.last_active)
        return evicted

    async def reload(self) -> list[str]:
        """Bring back the live jobs persisted under `dump_dir` (a restarted coordinator)."""
        if not self.settings.dump_data:
            return []
        restored = []
        for job_dir in JobDir.restorable(self.settings.dump_dir):
            if job_dir.name in self.jobs:
                continue
            try:
                job = await self._reload_job(job_dir)
            except Exception as exc:
                logger.warning(
                    "Refused to restore the job in %s (left as it is): %s", job_dir.path, exc
                )
                continue
            restored.append(job.job_id)
        if restored:
            logger.info(
                "Restored %d job(s) from %s: %s", len(restored), self.settings.dump_dir, restored
            )
        return restored

    def _trusted_scheduler(self, job_dir: JobDir) -> dict[str, Any]:
        """The job's scheduler arguments, if its ``scheduler.json`` names this coordinator's
        scheduler; `UntrustedDumpError` otherwise. Nothing is imported."""
        path = job_dir.scheduler
        if not path.is_file():
            raise UntrustedDumpError(
                f"{path.name} is missing: the job's scheduler is unknown (not restored with "
                f"{self.scheduler_cls.__name__} in its place)"
            )
        if path.stat().st_size > _MAX_META_BYTES:
            raise UntrustedDumpError(f"{path.name} is larger than {_MAX_META_BYTES} bytes")
        try:
            meta = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError) as exc:
            raise UntrustedDumpError(f"{path.name} is not valid JSON: {exc}") from None
        if not isinstance(meta, dict) or not isinstance(meta.get("scheduler"), str):
            raise UntrustedDumpError(f"{path.name} has no scheduler name")
        expected = scheduler_ref(self.scheduler_cls)
        if meta["scheduler"] != expected:
            raise UntrustedDumpError(
                f"{path.name} names scheduler {meta['scheduler'][:200]!r}, but this "
                f"coordinator runs {expected!r} (PERSEUS_SCHEDULER); start a coordinator "
                "with that scheduler to restore it"
            )
        args = meta.get("scheduler_args", {})
        if not isinstance(args, dict):
            raise UntrustedDumpError(f"{path.name}: scheduler_args is not a JSON object")
        check_scheduler_args(self.scheduler_cls, args)
        return args

    async def _reload_job(self, job_dir: JobDir) -> CoordinatedJob:
        try:
            info = JobRecord.model_validate_json(job_dir.job.read_bytes())
        except ValueError as exc:
            raise UntrustedDumpError(
                f"{job_dir.job.name} is not a valid job record: {exc}"
            ) from None
        if info.job_id != job_dir.name:
            raise UntrustedDumpError(
                f"{job_dir.job.name} is the record of job {info.job_id!r}, not of {job_dir.name!r}"
            )
        args = self._trusted_scheduler(job_dir)
        rank_infos: list[RankInfo] = []
        if job_dir.ranks.is_file():
            try:
                rank_infos = load_ranks(job_dir.path)
            except ValueError as exc:
                raise UntrustedDumpError(f"{job_dir.ranks.name} is not valid: {exc}") from None
            _check_restored_ranks(job_dir, info, rank_infos)
        elif job_dir.registering.is_file():
            rank_infos = _registered_so_far(job_dir, info)
        complete = len(rank_infos) == info.talking_ranks
        plan = None
        if complete and job_dir.deployed_plan.is_file():
            try:
                plan = load_plan(job_dir.deployed_plan)
            except (ValueError, PerseusError) as exc:
                raise UntrustedDumpError(
                    f"{job_dir.deployed_plan.name} is not a valid plan: {exc}"
                ) from None
        job = self._new_job(info, self.scheduler_cls, args)
        try:
            rounds = job_dir.rounds()
            job.round = job._new_round(rounds[-1] + 1 if rounds else 0)
            for rank_info in rank_infos:
                job.ranks[rank_info.rank] = rank_info
                job._coords[rank_info.dp_rank, rank_info.pp_rank, rank_info.tp_rank] = (
                    rank_info.rank
                )
            if complete:
                job.scheduler = await asyncio.to_thread(
                    build_scheduler, self.scheduler_cls, info, rank_infos, self.settings, args
                )
                job.phase = JobPhase.RUNNING
                if plan is not None:
                    await asyncio.to_thread(job.scheduler.resume, plan)
                    job._persisted_plan = plan.model_dump_json() + "\n"
                await asyncio.to_thread(_restore_report_rounds, job, rounds, plan)
        except BaseException:
            del self.jobs[job.job_id]
            raise
        logger.info(
            "Restored job %s at round %d (%d of %d talking ranks registered)%s",
            info.job_id,
            job.round.number,
            len(rank_infos),
            info.talking_ranks,
            " with its deployed plan" if plan is not None else "",
        )
        return job

    async def close(self) -> None:
        """Shutdown: fail pending rounds so no request hangs; wait for round tasks."""
        for timer in self._forget_timers.values():
            timer.cancel()
        self._forget_timers.clear()
        for job in self.jobs.values():
            job.close(CoordinatorBusyError("The coordinator is shutting down", job_id=job.job_id))
        tasks = [t for job in self.jobs.values() for t in job._tasks]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


def _restore_report_rounds(job: CoordinatedJob, rounds: list[int], plan: Any) -> None:
    """A restored job's latest dumped all-max and deployed rounds: kept from pruning again,
    and the energy report's measurements (worker thread: reads a few small files)."""
    max_freq = {r: max(i.available_frequencies) for r, i in job.ranks.items()}
    pp_rank = {r: i.pp_rank for r, i in job.ranks.items()}
    for number in rounds:
        try:
            kind = round_kind(
                load_sched(job.dir.path, number), max_freq=max_freq, pp_rank=pp_rank, plan=plan
            )
        except (OSError, ValueError):
            continue  # pruned meanwhile, or torn: it was not a report round
        if kind not in job.report_rounds:
            continue
        job.report_rounds[kind].append(number)
        try:
            figures = measure(load_prof(job.dir.path, number))
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
            raise UntrustedDumpError(
                f"{name} does not hold ranks 0..{info.world_size - 1} once each"
            )
    else:
        places = sorted((r.pp_rank, r.dp_rank) for r in rank_infos)
        expected = sorted((p, d) for p in range(info.pp_degree) for d in leaders.replicas)
        if places != expected or len({r.rank for r in rank_infos}) != len(rank_infos):
            raise UntrustedDumpError(
                f"{name} does not hold the job's {leaders.count} leader(s) once each"
            )
    for rank in rank_infos:
        bad = info.layout.out_of_range(
            rank=rank.rank, dp_rank=rank.dp_rank, pp_rank=rank.pp_rank, tp_rank=rank.tp_rank
        )
        if bad is not None or _not_its_leader(info, rank):
            raise UntrustedDumpError(f"{name}: rank {rank.rank} is not a talking rank of the job")


def _registered_so_far(job_dir: JobDir, info: JobRecord) -> list[RankInfo]:
    """The ranks of ``ranks.partial.jsonl`` (a job killed while its ranks registered).

    A last line without its newline was being written when the coordinator died: that rank
    never heard back and registers again, so it is skipped. Anything else that is not a
    valid, distinct rank of the job makes the dump untrusted.
    """
    path = job_dir.registering
    if path.stat().st_size > info.world_size * _MAX_RANK_LINE_BYTES:
        raise UntrustedDumpError(f"{path.name} is larger than {info.world_size} ranks can be")
    text = path.read_text(encoding="utf-8", errors="replace")
    # What follows the last newline is empty, or torn (being written when it was killed).
    lines = text.split("\n")[:-1]
    ranks: dict[int, RankInfo] = {}
    coords: set[tuple[int, int, int]] = set()
    for number, line in enumerate(lines, 1):
        try:
            rank = RankInfo.model_validate_json(line)
        except ValueError as exc:
            raise UntrustedDumpError(f"{path.name} line {number} is not valid: {exc}") from None
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
            raise UntrustedDumpError(
                f"{path.name} line {number}: rank {rank.rank} at {where} is not a new rank of "
                f"job {info.job_id}"
            )
        ranks[rank.rank] = rank
        coords.add(where)
    return [ranks[r] for r in sorted(ranks)]
