"""All jobs of one coordinator: registration, idle eviction, and restoring the jobs a
previous coordinator persisted under `dump_dir` (one job: `perseus.server.job`).

Restoring (`JobManager.reload`, before the server accepts a connection) brings back every
live job: its record as stored (credentials included), its scheduler with the arguments it
was registered with, its ranks, its round number (the last dumped round + 1) and its
deployed plan (`FrequencyScheduler.resume`) and the rounds its energy report is made from
(its latest dumped all-max and deployed rounds, kept from pruning). Evicted, failed and
finished jobs (their marker files) stay down. A dump it cannot trust is refused with a
warning and left as it is (`perseus.server.restore`).

A job that ends (fails or finishes) stays listed, with its state, for `ended_job_ttl_s`
seconds (``/jobs``, its ``/metrics`` series); then it is forgotten. An evicted job is
removed at once.
"""

from __future__ import annotations

import asyncio
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
    ScheduleError,
    SolverError,
    UnknownJobError,
)
from perseus.io.jobdir import JobDir
from perseus.protocol import (
    JobInfo,
    JobRecord,
)
from perseus.schedulers.base import build_scheduler, check_scheduler_args
from perseus.schedulers.registry import scheduler_ref
from perseus.server.job import CoordinatedJob
from perseus.server.job.barrier import JobPhase
from perseus.server.restore import read_dump, restore_report_rounds
from perseus.settings import PerseusSettings

__all__ = ["JobManager"]

logger = logging.getLogger(__name__)

_METADATA = re.compile(r"[A-Za-z0-9._+-]{1,64}")


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
        meta = {
            "scheduler": scheduler_ref(self.scheduler_cls),
            "scheduler_args": self.settings.scheduler_args,
        }
        await job.dump.text(job.dir.job, record.model_dump_json() + "\n")
        await job.dump.text(job.dir.scheduler, json.dumps(meta) + "\n")
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
            if not job.phase.ended:
                job.dump.mark("evicted", "idle\n")
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

    async def _reload_job(self, job_dir: JobDir) -> CoordinatedJob:
        dump = read_dump(job_dir, self.scheduler_cls)
        info, args, rank_infos, plan = dump.info, dump.scheduler_args, dump.ranks, dump.plan
        complete = dump.complete
        job = self._new_job(info, self.scheduler_cls, args)
        try:
            rounds = job_dir.rounds()
            job.rounds.restart_at(rounds[-1] + 1 if rounds else 0)
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
                    job.dump.persisted_plan = plan.model_dump_json() + "\n"
                await asyncio.to_thread(restore_report_rounds, job, rounds, plan)
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
