"""One coordinated job: its state and the scheduling-round barrier, all on the event loop.

All of a job's state lives in one `CoordinatedJob`. Its methods run on the server's event
loop (no locks needed between a check and the update that follows it); the scheduler's
methods, which may be slow (a frontier solve), run in a worker thread, one call at a time
per job (`CoordinatedJob.lock`), so a long solve never blocks the loop or other jobs.

A round is a barrier (`Round`): every rank's ``GET /schedule`` awaits the round's future.
When the last rank has asked (and every rank has registered), one task observes the
previous round's results, asks the scheduler for the next schedules and resolves the
future. If the barrier is not complete `round_timeout_s` after the round's first request,
a timer fails the future (504 for every waiting rank) and the job (409 afterwards).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from perseus.domain.plan import Plan
from perseus.errors import (
    CoordinatorError,
    InvalidRankError,
    InvalidResultError,
    JobFailedError,
    PerseusError,
    RankConflictError,
    RoundTimeoutError,
    SchedulerFailedError,
)
from perseus.io.atomic import atomic_write_text
from perseus.io.jobdir import JobDir
from perseus.protocol import (
    FrequencySchedule,
    JobRecord,
    ProfilingResult,
    RankInfo,
    save_prof,
    save_ranks,
    save_sched,
)
from perseus.server.errors import scheduler_error_status
from perseus.settings import PerseusSettings
from schedulers.base import FrequencyScheduler, build_scheduler

__all__ = ["CoordinatedJob", "JobPhase", "Round", "ranks_text"]

logger = logging.getLogger(__name__)


class JobPhase(enum.Enum):
    """A job's lifecycle.

    REGISTERING → RUNNING        when the last rank registers and its scheduler is built
    REGISTERING → FAILED         the scheduler could not be built, or a round timed out
    RUNNING     → FAILED         a round timed out or the scheduler raised
    FAILED is terminal: every later call gets the failure (status and message).
    Eviction (idle too long) removes the job in any state.
    """

    REGISTERING = "registering"
    RUNNING = "running"
    FAILED = "failed"


@dataclass(eq=False)
class Round:
    """One scheduling round's barrier."""

    number: int
    future: asyncio.Future[dict[int, FrequencySchedule]]
    asked: set[int] = field(default_factory=set)
    timer: asyncio.TimerHandle | None = None
    completing: bool = False


def ranks_text(ranks: list[int]) -> str:
    """``[0, 2-5, 9]``: sorted ranks with consecutive runs collapsed (readable for 1000s)."""
    parts: list[str] = []
    start = prev = None
    for r in sorted(ranks):
        if prev is not None and r == prev + 1:
            prev = r
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = r
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return "[" + ", ".join(parts) + "]"


def _fail_round(rnd: Round, error: BaseException) -> None:
    """Fail a round's future, marking the exception retrieved (there may be no waiter)."""
    if rnd.timer is not None:
        rnd.timer.cancel()
    if not rnd.future.done():
        rnd.future.set_exception(error)
        rnd.future.exception()


class CoordinatedJob:
    """Everything the coordinator knows about one job."""

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
        self.settings = settings
        self.scheduler_cls = scheduler_cls
        self.scheduler_args = dict(scheduler_args)
        self.round_timeout_s = round_timeout_s
        self.ranks: dict[int, RankInfo] = {}
        self._coords: dict[tuple[int, int, int], int] = {}
        self.scheduler: FrequencyScheduler | None = None
        self.phase = JobPhase.REGISTERING
        self.failure: CoordinatorError | None = None
        self.results: dict[int, ProfilingResult] = {}
        self.round = self._new_round(0)
        self.lock = asyncio.Lock()
        self.last_active = time.monotonic()
        self._persisted_plan: str | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ basics
    @property
    def dumping(self) -> bool:
        """Whether the job's state is dumped to `dir` (`dump_data`)."""
        return self.settings.dump_data

    @property
    def busy(self) -> bool:
        """A scheduler call is in flight (the job must not be evicted)."""
        return self.round.completing or self.lock.locked()

    @property
    def emulated(self) -> bool:
        """Some rank registered an emulated GPU: the job's numbers are the emulator's."""
        return any(info.emulated for info in self.ranks.values())

    def touch(self) -> None:
        self.last_active = time.monotonic()

    def _new_round(self, number: int) -> Round:
        return Round(number, asyncio.get_running_loop().create_future())

    def check_usable(self) -> None:
        """Raise the job's failure if it failed."""
        if self.failure is not None:
            raise JobFailedError(str(self.failure), status_code=self.failure.status)

    def check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.info.world_size:
            raise InvalidRankError(
                f"Rank {rank} is out of range for job {self.job_id}: world_size is "
                f"{self.info.world_size} (valid ranks 0..{self.info.world_size - 1})"
            )

    def fail(self, error: CoordinatorError, *, later_status: int | None = None) -> None:
        """Mark the job failed; later calls get `error`'s message with `later_status`."""
        if self.failure is None:
            status = later_status if later_status is not None else error.status
            self.failure = JobFailedError(str(error), status_code=status)
            self.phase = JobPhase.FAILED
            logger.error("Job %s failed: %s", self.job_id, error)
        if self.round.timer is not None:
            self.round.timer.cancel()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ registration
    async def register_rank(self, info: RankInfo) -> None:
        self.touch()
        self.check_usable()
        self.check_rank(info.rank)
        bad = self.info.layout.out_of_range(
            rank=info.rank, dp_rank=info.dp_rank, pp_rank=info.pp_rank, tp_rank=info.tp_rank
        )
        if bad is not None:
            name, value, degree = bad
            raise InvalidRankError(
                f"Rank {info.rank}: {name} {value} is out of range for job {self.job_id} "
                f"(its degree is {degree}; valid 0..{degree - 1})"
            )
        if not info.available_frequencies or min(info.available_frequencies) <= 0:
            raise InvalidRankError(
                f"Rank {info.rank}: available_frequencies must be a non-empty list of positive "
                f"MHz values, got {info.available_frequencies!r}"
            )
        if info.rank in self.ranks:
            raise RankConflictError(
                f"Rank {info.rank} is already registered with job {self.job_id}; every rank "
                "registers once (a restarted job registers a new job)"
            )
        coords = (info.dp_rank, info.pp_rank, info.tp_rank)
        if coords in self._coords:
            raise InvalidRankError(
                f"Rank {info.rank}: (dp_rank, pp_rank, tp_rank) = {coords} is already taken by "
                f"rank {self._coords[coords]} in job {self.job_id}; ranks are inconsistent"
            )
        self.ranks[info.rank] = info
        self._coords[coords] = info.rank
        if len(self.ranks) == self.info.world_size:
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
                    status_code=scheduler_error_status(exc),
                )
                self.fail(error)
                _fail_round(self.round, error)
                raise error from None
        self.phase = JobPhase.RUNNING
        if self.dumping:
            await self._dump(save_ranks(rank_infos, self.dir.path))
        logger.info("Job %s: all %d ranks registered", self.job_id, len(rank_infos))
        self._maybe_complete()

    # ------------------------------------------------------------------ rounds
    async def get_schedule(self, rank: int) -> FrequencySchedule:
        self.touch()
        self.check_usable()
        self.check_rank(rank)
        rnd = self.round
        rnd.asked.add(rank)
        if rnd.timer is None and not rnd.completing:
            rnd.timer = asyncio.get_running_loop().call_later(
                self.round_timeout_s, self._on_timeout, rnd
            )
        self._maybe_complete()
        schedules = await asyncio.shield(rnd.future)
        return schedules[rank]

    def _maybe_complete(self) -> None:
        rnd = self.round
        if (
            self.scheduler is None
            or rnd.completing
            or rnd.future.done()
            or len(rnd.asked) < self.info.world_size
        ):
            return
        rnd.completing = True
        if rnd.timer is not None:
            rnd.timer.cancel()
        self._spawn(self._complete(rnd))

    def _on_timeout(self, rnd: Round) -> None:
        if rnd is not self.round or rnd.completing or rnd.future.done():
            return
        never_asked = sorted(set(range(self.info.world_size)) - rnd.asked)
        unregistered = sorted(set(range(self.info.world_size)) - set(self.ranks))
        message = (
            f"Round {rnd.number} of job {self.job_id} timed out after {self.round_timeout_s:g} s: "
            f"rank(s) {ranks_text(never_asked)} never asked for their schedule"
        )
        if unregistered:
            message += f"; rank(s) {ranks_text(unregistered)} never registered"
        error = RoundTimeoutError(message)
        self.fail(error, later_status=409)
        _fail_round(rnd, error)

    def _run_scheduler(
        self, results: list[ProfilingResult], round_number: int
    ) -> tuple[list[FrequencySchedule], Plan | None]:
        """Worker thread: observe the last round, produce the next one."""
        assert self.scheduler is not None
        if results:
            self.scheduler.observe(results)
        schedules = self.scheduler.next_schedule()
        plan = self.scheduler.deployed_plan()
        if plan is not None and self.emulated and not plan.emulated:
            plan = plan.model_copy(update={"emulated": True})  # the persisted plan says so
        return schedules, plan

    async def _complete(self, rnd: Round) -> None:
        results = [self.results[r] for r in sorted(self.results)]
        self.results = {}
        name = self.scheduler_cls.__name__
        try:
            async with self.lock:
                schedules, plan = await asyncio.to_thread(self._run_scheduler, results, rnd.number)
            by_rank = {s.rank: s for s in schedules}
            missing = sorted(set(range(self.info.world_size)) - set(by_rank))
            if missing or len(schedules) != self.info.world_size:
                raise RuntimeError(
                    f"it returned {len(schedules)} schedule(s) for world_size "
                    f"{self.info.world_size} (missing ranks {ranks_text(missing)})"
                )
        except Exception as exc:
            error = SchedulerFailedError(
                f"Scheduler {name} failed in round {rnd.number} of job {self.job_id}: {exc}",
                status_code=scheduler_error_status(exc),
            )
            if scheduler_error_status(exc) >= 500:
                logger.error("Job %s: scheduler crashed", self.job_id, exc_info=exc)
            self.fail(error)
            _fail_round(rnd, error)
            return
        if self.dumping:
            if results:
                await self._dump(save_prof(results, self.dir.path, rnd.number - 1))
            await self._dump(save_sched(schedules, self.dir.path, rnd.number))
            if plan is not None:
                text = plan.model_dump_json() + "\n"
                if text != self._persisted_plan:
                    await self._dump(
                        asyncio.to_thread(atomic_write_text, self.dir.deployed_plan, text)
                    )
                    self._persisted_plan = text
        self.round = self._new_round(rnd.number + 1)
        self.touch()
        rnd.future.set_result(by_rank)

    async def _dump(self, awaitable: Any) -> None:
        try:
            await awaitable
        except OSError as exc:
            logger.error("Job %s: could not write the dump: %s", self.job_id, exc)

    # ------------------------------------------------------------------ results & stragglers
    async def report_result(self, result: ProfilingResult) -> None:
        self.touch()
        self.check_usable()
        self.check_rank(result.rank)
        if self.round.number == 0:
            raise RankConflictError(
                f"Rank {result.rank} reported a result for job {self.job_id} before any "
                "schedule was handed out; ask for a schedule, run it, then report"
            )
        if result.rank in self.round.asked:
            raise RankConflictError(
                f"Rank {result.rank} already asked for round {self.round.number}'s schedule of "
                f"job {self.job_id}; report round {self.round.number - 1}'s result before asking"
            )
        if result.rank in self.results:
            raise RankConflictError(
                f"Rank {result.rank} already reported its result for round "
                f"{self.round.number - 1} of job {self.job_id}; report once per round"
            )
        if self.scheduler is not None:
            # Shapes against the job's schedule, before the result is kept: a refused result
            # leaves the job as it was, and the rank may send a corrected one.
            try:
                self.scheduler.check_result(result)
            except (PerseusError, ValueError) as exc:
                raise InvalidResultError(
                    f"Result of rank {result.rank} for round {self.round.number - 1} of job "
                    f"{self.job_id} refused: {exc}"
                ) from None
        self.results[result.rank] = result

    async def announce_straggler(self, dp_rank: int, slowdown: float) -> None:
        self.touch()
        self.check_usable()
        if self.scheduler is None:
            raise CoordinatorError(
                f"Job {self.job_id} has not started: {len(self.ranks)} of "
                f"{self.info.world_size} ranks registered",
                status_code=409,
            )
        async with self.lock:
            try:
                await asyncio.to_thread(self.scheduler.on_straggler, dp_rank, slowdown)
            except (PerseusError, ValueError) as exc:
                raise CoordinatorError(str(exc), status_code=400) from None

    # ------------------------------------------------------------------ lifecycle
    def close(self, error: CoordinatorError) -> None:
        """Fail the pending round (shutdown or eviction) and cancel its timer."""
        _fail_round(self.round, error)
