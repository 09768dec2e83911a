"""One coordinated job: its state, registration and lifecycle, all on the event loop.

All of a job's state lives in one `CoordinatedJob`. Its methods run on the server's event
loop (no locks needed between a check and the update that follows it); the scheduler's
methods, which may be slow (a frontier solve), run in a worker thread, one call at a time
per job (`CoordinatedJob.lock`), so a long solve never blocks the loop or other jobs.

Its rounds are a part it owns (`JobRounds`, `perseus.server.job.rounds`): a round is a barrier.

The talking ranks are every rank of a protocol-1 job, and only the leaders of a protocol-2
job (`JobInfo.leaders`, `perseus.domain.layout.Leaders`): each registers, reports and asks
for its whole group, so registration, the barrier, the results and the schedules all count
leaders, and the coordinator's work per round grows with them, not with the world. A rank
that is not a leader and registers, reports or asks anyway is refused with 422
(`InvalidRankError`), naming the rule.

With `dump_data`, what a restarted coordinator needs is on disk as soon as it is known
(`perseus.server.job.dump`). A rank's identical registration or result sent again (a client
retrying through a coordinator outage) is accepted without effect.

A job finishes when its rank 0 closes normally (``POST /finish/{job_id}``, after every rank
has closed): the pending round's timer is cancelled and its waiting requests get 409, the
results of the round the ranks were in are still taken (they finish their last round before
they close), and every other later call gets 409. A job whose ranks die never finishes: it
fails at the round timeout.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from perseus.errors import (
    InvalidRankError,
    JobError,
    JobStateError,
    PerseusError,
    RankConflictError,
    SchedulerFailedError,
)
from perseus.io.jobdir import JobDir
from perseus.protocol import FrequencySchedule, JobRecord, ProfilingResult, RankInfo
from perseus.schedulers.base import FrequencyScheduler, build_scheduler
from perseus.server.errors import status_of
from perseus.server.job.barrier import JobPhase, Round, fail_round, ranks_text
from perseus.server.job.dump import JobDump
from perseus.server.job.leaders import check_registration
from perseus.server.job.rounds import JobRounds
from perseus.server.job.stats import JobStats
from perseus.settings import PerseusSettings

__all__ = ["CoordinatedJob", "JobPhase", "Round", "ranks_text"]

logger = logging.getLogger(__name__)


class CoordinatedJob:
    """Everything the coordinator knows about one job: its registration and lifecycle here,
    its rounds in `rounds`."""

    def __init__(
        self,
        info: JobRecord,
        settings: PerseusSettings,
        *,
        scheduler_cls: type,
        scheduler_args: dict[str, Any],
        round_timeout_s: float,
    ) -> None:
        self.info = info
        self.job_id = info.job_id
        self.dir = JobDir.of(settings.dump_dir, info.job_id)
        """The job's directory (its state is dumped there when `dumping`)."""
        self.dump = JobDump(
            info.job_id,
            self.dir,
            enabled=settings.dump_data,
            keep_rounds=settings.dump_keep_rounds,
        )
        """What a restart needs, written as it is known (`perseus.server.job.dump`)."""
        self.settings = settings
        self.scheduler_cls = scheduler_cls
        self.scheduler_args = dict(scheduler_args)
        self.round_timeout_s = round_timeout_s
        self.leaders = info.leaders
        """Protocol 2: who talks to the coordinator; None: every rank (protocol 1)."""
        self.talking_ranks = info.talking_ranks
        """Ranks that register, report and ask: the leaders, or the world (protocol 1)."""
        self.ranks: dict[int, RankInfo] = {}
        self._coords: dict[tuple[int, int, int], int] = {}
        self.scheduler: FrequencyScheduler | None = None
        self.phase = JobPhase.REGISTERING
        self.failure: JobError | None = None
        self.lock = asyncio.Lock()
        """One scheduler call at a time (its methods run in a worker thread)."""
        self.last_active = time.monotonic()
        self._tasks: set[asyncio.Task[None]] = set()
        self.stats = JobStats(self.talking_ranks, info.dp_degree)
        """What the operator's view shows (`perseus.server.job.stats`)."""
        self.on_round: Callable[[CoordinatedJob, float], None] | None = None
        """Called with the round's latency (s) when a round's schedules are handed out."""
        self.on_end: Callable[[CoordinatedJob], None] | None = None
        """Called once when the job fails or finishes."""
        self.rounds = JobRounds(self)
        """The job's rounds: the barrier, the scheduler's turn, the ranks' results."""

    # ------------------------------------------------------------------ basics
    @property
    def dumping(self) -> bool:
        """Whether the job's state is dumped to `dir` (`dump_data`)."""
        return self.settings.dump_data

    @property
    def busy(self) -> bool:
        """A scheduler call is in flight (the job must not be evicted)."""
        return self.rounds.busy or self.lock.locked()

    @property
    def round(self) -> Round:
        """The round in progress (`JobRounds.current`)."""
        return self.rounds.current

    @property
    def emulated(self) -> bool:
        """Some rank registered an emulated GPU: the job's numbers are the emulator's."""
        return any(info.emulated for info in self.ranks.values())

    def touch(self) -> None:
        self.last_active = time.monotonic()

    async def get_schedule(self, rank: int) -> FrequencySchedule:
        """`rank`'s schedule for the round in progress, once every talking rank has asked
        (`JobRounds.get_schedule`)."""
        return await self.rounds.get_schedule(rank)

    async def report_result(self, result: ProfilingResult) -> None:
        """A talking rank's result for the previous round (`JobRounds.report_result`)."""
        await self.rounds.report_result(result)

    def check_usable(self) -> None:
        """Raise a `JobStateError` carrying the job's failure if it failed, or saying it
        finished."""
        if self.failure is not None:
            raise JobStateError(str(self.failure), job_id=self.job_id, cause=self.failure)
        if self.phase is JobPhase.FINISHED:
            raise JobStateError(
                f"Job {self.job_id} has finished (its ranks closed): it runs no more rounds; "
                "a new training run registers a new job",
                job_id=self.job_id,
            )

    def check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.info.world_size:
            raise InvalidRankError(
                f"Rank {rank} is out of range for job {self.job_id}: world_size is "
                f"{self.info.world_size} (valid ranks 0..{self.info.world_size - 1})",
                rank=rank,
            )

    def check_talker(self, rank: int) -> None:
        """Protocol 2: raise `InvalidRankError` unless `rank` registered as a leader (every
        rank talks under protocol 1)."""
        if self.leaders is not None and rank not in self.ranks:
            raise InvalidRankError(
                f"Rank {rank} is not a registered leader of job {self.job_id}: "
                f"{self.leaders.rule}. A leader registers (POST /register_rank) before it "
                "reports or asks",
                rank=rank,
            )

    def registered_text(self) -> str:
        """``3 of 16 leaders registered`` (``ranks`` under protocol 1)."""
        who = "ranks" if self.leaders is None else "leaders"
        return f"{len(self.ranks)} of {self.talking_ranks} {who} registered"

    def fail(self, error: JobError) -> None:
        """Mark the job failed; later calls get a `JobStateError` carrying `error`
        (`perseus.server.errors` maps it). A finished job stays finished (a scheduler still busy with a round it was given
        before the finish may fail: nobody waits for that round)."""
        if self.phase is JobPhase.FINISHED:
            logger.info("Job %s (finished): %s", self.job_id, error)
            return
        if self.failure is None:
            self.failure = error
            self.phase = JobPhase.FAILED
            logger.error("Job %s failed: %s", self.job_id, error)
            status = status_of(JobStateError(str(error), cause=error))
            self.dump.mark("failed", f"{status} {error}\n")
            self._stop_scheduler()
            if self.on_end is not None:
                self.on_end(self)
        if self.round.timer is not None:
            self.round.timer.cancel()

    def _stop_scheduler(self) -> None:
        """Stop the scheduler's background work (a frontier solve's process): the job is
        over for this coordinator. Never raises (the job's end must go through)."""
        if self.scheduler is None:
            return
        try:
            self.scheduler.close()
        except Exception:
            logger.exception("Job %s: the scheduler failed to close", self.job_id)

    def spawn(self, coro: Any) -> None:
        """Run `coro` on the event loop as the job's task (kept until it ends)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ registration
    async def register_rank(self, info: RankInfo) -> None:
        self.touch()
        self.check_rank(info.rank)
        bad = self.info.layout.out_of_range(
            rank=info.rank, dp_rank=info.dp_rank, pp_rank=info.pp_rank, tp_rank=info.tp_rank
        )
        if bad is not None:
            name, value, degree = bad
            raise InvalidRankError(
                f"Rank {info.rank}: {name} {value} is out of range for job {self.job_id} "
                f"(its degree is {degree}; valid 0..{degree - 1})",
                rank=info.rank,
            )
        check_registration(self.job_id, self.leaders, info)
        self.check_usable()
        if not info.available_frequencies or min(info.available_frequencies) <= 0:
            raise InvalidRankError(
                f"Rank {info.rank}: available_frequencies must be a non-empty list of positive "
                f"MHz values, got {info.available_frequencies!r}",
                rank=info.rank,
            )
        if info.rank in self.ranks:
            if self.ranks[info.rank] == info:
                return  # the same registration again (a retry after a lost answer)
            raise RankConflictError(
                f"Rank {info.rank} is already registered with job {self.job_id}; every rank "
                "registers once (a restarted job registers a new job)",
                rank=info.rank,
            )
        coords = (info.dp_rank, info.pp_rank, info.tp_rank)
        if coords in self._coords:
            raise InvalidRankError(
                f"Rank {info.rank}: (dp_rank, pp_rank, tp_rank) = {coords} is already taken by "
                f"rank {self._coords[coords]} in job {self.job_id}; ranks are inconsistent",
                rank=info.rank,
            )
        self.ranks[info.rank] = info
        self._coords[coords] = info.rank
        complete = len(self.ranks) == self.talking_ranks  # decided before any await
        await self.dump.registration(info)  # before the rank hears back: a restart keeps it
        if complete:
            await self._start()

    async def _start(self) -> None:
        """Build the job's scheduler (in a thread) once every rank has registered."""
        rank_infos = [self.ranks[r] for r in sorted(self.ranks)]
        async with self.lock:
            try:
                self.scheduler = await asyncio.to_thread(
                    build_scheduler,
                    self.scheduler_cls,
                    self.info,
                    rank_infos,
                    self.settings,
                    self.scheduler_args,
                )
            except Exception as exc:
                error = SchedulerFailedError(
                    f"Scheduler {self.scheduler_cls.__name__} could not start job "
                    f"{self.job_id}: {exc}",
                    job_id=self.job_id,
                    cause=exc,
                )
                self.fail(error)
                fail_round(self.round, error)
                raise error from None
        self.phase = JobPhase.RUNNING
        await self.dump.all_ranks(rank_infos)
        logger.info(
            "Job %s: all %d %s registered",
            self.job_id,
            len(rank_infos),
            "ranks" if self.leaders is None else "leaders",
        )
        self.rounds.maybe_complete()

    # ------------------------------------------------------------------ stragglers
    async def announce_straggler(self, dp_rank: int, slowdown: float) -> None:
        self.touch()
        self.check_usable()
        if self.scheduler is None:
            raise JobStateError(
                f"Job {self.job_id} has not started: {self.registered_text()}",
                job_id=self.job_id,
            )
        async with self.lock:
            try:
                await asyncio.to_thread(self.scheduler.on_straggler, dp_rank, slowdown)
            except (PerseusError, ValueError) as exc:
                raise SchedulerFailedError(str(exc), job_id=self.job_id, cause=exc) from None

    # ------------------------------------------------------------------ lifecycle
    def finish(self) -> None:
        """The job ended normally (its rank 0 closed after every rank closed): no more
        rounds. Idempotent (a retried request); a failed job answers its failure.

        Raises:
            JobStateError: The job failed before, or not every rank has registered (the
                job never ran).
        """
        self.touch()
        if self.phase is JobPhase.FINISHED:
            return
        self.check_usable()
        if self.scheduler is None:
            raise JobStateError(
                f"Job {self.job_id} cannot finish: it never started ({self.registered_text()})",
                job_id=self.job_id,
            )
        self.phase = JobPhase.FINISHED
        rnd = self.round
        if rnd.timer is not None:
            rnd.timer.cancel()
        if not rnd.completing:  # a round being computed is handed out as usual
            fail_round(
                rnd,
                JobStateError(
                    f"Job {self.job_id} finished before round {rnd.number} ran",
                    job_id=self.job_id,
                ),
            )
        self.dump.mark("finished", f"finished after round {rnd.number - 1}\n")
        self._stop_scheduler()
        report = self.stats.report()
        figures = ""
        if report.measured_saving is not None and report.measured_slowdown is not None:
            figures = (
                f"; measured {100 * report.measured_saving:.1f} % energy saved at "
                f"{100 * report.measured_slowdown:+.2f} % iteration time"
            )
        logger.info(
            "Job %s finished after %d round(s), %.1f J measured%s",
            self.job_id,
            self.stats.rounds_completed,
            self.stats.energy_j_total,
            figures,
        )
        if self.on_end is not None:
            self.on_end(self)

    def close(self, error: JobError) -> None:
        """Fail the pending round (shutdown or eviction) and cancel its timer; stop the
        scheduler's background work."""
        fail_round(self.round, error)
        self._stop_scheduler()
