"""All jobs of one coordinator: registration, idle eviction, and restoring the jobs a
previous coordinator persisted under `dump_dir` (one job: `perseus.server.job`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from typing import Any

from perseus.errors import (
    ConfigurationError,
    CoordinatorError,
    InvalidJobError,
    JobNotFoundError,
    ScheduleError,
    SolverError,
)
from perseus.io.atomic import atomic_write_text
from perseus.io.jobdir import JobDir
from perseus.io.plan_file import load_plan
from perseus.protocol import (
    JobInfo,
    JobRecord,
    load_ranks,
)
from perseus.server.job import CoordinatedJob, JobPhase
from perseus.settings import PerseusSettings
from schedulers.base import build_scheduler, check_scheduler_args
from schedulers.registry import resolve_scheduler, scheduler_ref

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

    def get(self, job_id: str) -> CoordinatedJob:
        try:
            return self.jobs[job_id]
        except KeyError:
            raise JobNotFoundError(
                f"Unknown job id {job_id!r}: register the job first (POST /register_job); "
                "jobs idle longer than max_job_idle_time are evicted"
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
        self.jobs[job.job_id] = job
        return job

    async def create_job(self, info: JobInfo, *, token_sha256: str | None = None) -> str:
        """Register a job; returns its new id. `token_sha256`: the hash of the credential
        its ranks will present (stored with the job, dumped in ``job.json``).

        Raises:
            InvalidJobError: (422) bad metadata, a world size over `max_world_size`, or a
                job the scheduler cannot run.
            CoordinatorError: (503) `max_jobs` jobs are live already.
        """
        if info.world_size > self.settings.max_world_size:
            raise InvalidJobError(
                f"world_size {info.world_size} is over this coordinator's limit of "
                f"{self.settings.max_world_size} ranks (PERSEUS_MAX_WORLD_SIZE)"
            )
        live = sum(1 for job in self.jobs.values() if job.phase is not JobPhase.FAILED)
        if live >= self.settings.max_jobs:
            raise CoordinatorError(
                f"This coordinator already runs {live} live jobs, its limit "
                "(PERSEUS_MAX_JOBS): try again when one has ended or been evicted",
                status_code=503,
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
        logger.info("Registered job %s (world_size %d)", record.job_id, record.world_size)
        return record.job_id

    def evict_idle(self, *, now: float | None = None) -> list[str]:
        """Remove jobs idle longer than `max_job_idle_time`; returns their ids."""
        now = time.monotonic() if now is None else now
        evicted = []
        for job_id, job in list(self.jobs.items()):
            if job.busy or now - job.last_active <= self.settings.max_job_idle_time:
                continue
            del self.jobs[job_id]
            job.close(JobNotFoundError(f"Job {job_id} was evicted (idle)"))
            if job.dumping and job.dir.path.is_dir():
                with contextlib.suppress(OSError):
                    job.dir.evicted.write_text("idle\n")
            evicted.append(job_id)
            logger.info("Evicted job %s (idle %.0f s)", job_id, now - job.last_active)
        return evicted

    async def reload(self) -> list[str]:
        """Bring back the jobs persisted under `dump_dir` (a restarted coordinator)."""
        if not self.settings.dump_data:
            return []
        restored = []
        for job_dir in JobDir.restorable(self.settings.dump_dir):
            if job_dir.name in self.jobs:
                continue
            try:
                job = await self._reload_job(job_dir)
            except Exception as exc:
                logger.warning("Could not restore the job in %s: %s", job_dir.path, exc)
                continue
            restored.append(job.job_id)
        if restored:
            logger.info(
                "Restored %d job(s) from %s: %s", len(restored), self.settings.dump_dir, restored
            )
        return restored

    async def _reload_job(self, job_dir: JobDir) -> CoordinatedJob:
        info = JobRecord.model_validate_json(job_dir.job.read_text())
        if job_dir.scheduler.is_file():
            meta = json.loads(job_dir.scheduler.read_text())
            scheduler_cls = resolve_scheduler(meta["scheduler"])
            args = dict(meta.get("scheduler_args", {}))
        else:
            scheduler_cls, args = self.scheduler_cls, self.settings.scheduler_args
        job = self._new_job(info, scheduler_cls, args)
        try:
            rounds = job_dir.rounds()
            job.round = job._new_round(rounds[-1] + 1 if rounds else 0)
            if job_dir.ranks.is_file():
                for rank_info in load_ranks(job_dir.path):
                    job.ranks[rank_info.rank] = rank_info
                    job._coords[rank_info.dp_rank, rank_info.pp_rank, rank_info.tp_rank] = (
                        rank_info.rank
                    )
            if len(job.ranks) == info.world_size:
                rank_infos = [job.ranks[r] for r in sorted(job.ranks)]
                job.scheduler = await asyncio.to_thread(
                    build_scheduler, scheduler_cls, info, rank_infos, self.settings, args
                )
                job.phase = JobPhase.RUNNING
                if job_dir.deployed_plan.is_file():
                    plan = load_plan(job_dir.deployed_plan)
                    await asyncio.to_thread(job.scheduler.resume, plan)
                    job._persisted_plan = plan.model_dump_json() + "\n"
        except BaseException:
            del self.jobs[job.job_id]
            raise
        return job

    async def close(self) -> None:
        """Shutdown: fail pending rounds so no request hangs; wait for round tasks."""
        for job in self.jobs.values():
            job.close(CoordinatorError("The coordinator is shutting down", status_code=503))
        tasks = [t for job in self.jobs.values() for t in job._tasks]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
