"""One coordinated job: its state and the scheduling-round barrier, all on the event loop.

All of a job's state lives in one `CoordinatedJob`. Its methods run on the server's event
loop (no locks needed between a check and the update that follows it); the scheduler's
methods, which may be slow (a frontier solve), run in a worker thread, one call at a time
per job (`CoordinatedJob.lock`), so a long solve never blocks the loop or other jobs.

A round is a barrier (`Round`): every talking rank's ``GET /schedule`` awaits the round's
future. When the last one has asked (and every one has registered), one task observes the
previous round's results, asks the scheduler for the next schedules and resolves the
future. If the barrier is not complete `round_timeout_s` after the round's first request,
a timer fails the future (504 for every waiting rank) and the job (409 afterwards).

The talking ranks are every rank of a protocol-1 job, and only the leaders of a protocol-2
job (`JobInfo.leaders`, `perseus.domain.layout.Leaders`): each registers, reports and asks
for its whole group, so registration, the barrier, the results and the schedules all count
leaders, and the coordinator's work per round grows with them, not with the world. A rank
that is not a leader and registers, reports or asks anyway is refused with 422
(`InvalidRankError`), naming the rule.

With `dump_data`, what a restarted coordinator needs is on disk as soon as it is known: each
rank's registration before it is answered (``ranks.partial.jsonl``), all ranks
(``ranks.json``) when the last one registers, a round's results when its last result arrives (so
the job's last round is kept too), the schedules and the deployed plan when a round
completes (older rounds pruned to `dump_keep_rounds`, but never the latest
`dump_keep_rounds` all-max and deployed rounds, which the energy report is made from), a
``failed`` marker when the job fails and a ``finished`` marker when it finishes (neither is
ever restored). A rank's identical registration or result sent again (a client retrying
through a coordinator outage) is accepted without effect.

A job finishes when its rank 0 closes normally (``POST /finish/{job_id}``, after every rank
has closed): the pending round's timer is cancelled and its waiting requests get 409, the
results of the round the ranks were in are still taken (they finish their last round before
they close), and every other later call gets 409. A job whose ranks die never finishes: it
fails at the round timeout, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from perseus.domain.plan import Plan
from perseus.errors import (
    InvalidRankError,
    InvalidResultError,
    JobError,
    JobStateError,
    PerseusError,
    RankConflictError,
    RoundTimeoutError,
    SchedulerFailedError,
)
from perseus.io.atomic import atomic_write_text
from perseus.io.jobdir import JobDir
from perseus.planning.report import REPORT_WINDOW, RoundKind, round_kind
from perseus.protocol import (
    FrequencySchedule,
    JobRecord,
    ProfilingResult,
    RankInfo,
    save_prof,
    save_ranks,
    save_sched,
)
from perseus.server.errors import status_of
from perseus.server.stats import JobStats
from perseus.settings import PerseusSettings
from schedulers.base import FrequencyScheduler, build_scheduler

__all__ = ["CoordinatedJob", "JobPhase", "Round", "ranks_text"]

logger = logging.getLogger(__name__)


class JobPhase(enum.Enum):
    """A job's lifecycle.

    REGISTERING → RUNNING        when the last rank registers and its scheduler is built
    REGISTERING → FAILED         the scheduler could not be built, or a round timed out
    RUNNING     → FAILED         a round timed out or the scheduler raised
    RUNNING     → FINISHED       its rank 0 closed normally (``POST /finish``)
    FAILED and FINISHED are terminal: every later call gets the failure (status and message)
    or 409 (finished; the results of the job's last round are still taken). Eviction (idle
    too long) removes the job in any state; an ended job is forgotten `ended_job_ttl_s`
    after it ended (`perseus.server.job_manager`).
    """

    REGISTERING = "registering"
    RUNNING = "running"
    FAILED = "failed"
    FINISHED = "finished"

    @property
    def ended(self) -> bool:
        """FAILED or FINISHED: the job runs no more rounds."""
        return self in (JobPhase.FAILED, JobPhase.FINISHED)


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
        self.leaders = info.leaders
        """Protocol 2: who talks to the coordinator; None: every rank (protocol 1)."""
        self.talking_ranks = info.talking_ranks
        """Ranks that register, report and ask: the leaders, or the world (protocol 1)."""
        self.ranks: dict[int, RankInfo] = {}
        self._coords: dict[tuple[int, int, int], int] = {}
        self.scheduler: FrequencyScheduler | None = None
        self.phase = JobPhase.REGISTERING
        self.failure: JobError | None = None
        self.results: dict[int, ProfilingResult] = {}
        self.round = self._new_round(0)
        self.lock = asyncio.Lock()
        self.last_active = time.monotonic()
        self._persisted_plan: str | None = None
        self._results_dumped = False
        """The current `results` (all ranks) were written when the last one arrived."""
        self._tasks: set[asyncio.Task[None]] = set()
        self.stats = JobStats(self.talking_ranks, info.dp_degree)
        """What the operator's view shows (`perseus.server.stats`)."""
        self.on_round: Callable[[CoordinatedJob, float], None] | None = None
        """Called with the round's latency (s) when a round's schedules are handed out."""
        self.on_end: Callable[[CoordinatedJob], None] | None = None
        """Called once when the job fails or finishes."""
        keep = REPORT_WINDOW + 1  # round 0 is all-max but no report's
        self.report_rounds: dict[RoundKind, deque[int]] = {
            RoundKind.ALL_MAX: deque(maxlen=keep),
            RoundKind.DEPLOYED: deque(maxlen=keep),
        }
        """The newest all-max and deployed rounds: the energy report's, never pruned."""
        self._rank_max: dict[int, int] | None = None
        self._rank_pp: dict[int, int] = {}

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
                f"{self.info.world_size} (valid ranks 0..{self.info.world_size - 1})"
            )

    def check_talker(self, rank: int) -> None:
        """Protocol 2: raise `InvalidRankError` unless `rank` registered as a leader (every
        rank talks under protocol 1)."""
        if self.leaders is not None and rank not in self.ranks:
            raise InvalidRankError(
                f"Rank {rank} is not a registered leader of job {self.job_id}: "
                f"{self.leaders.rule}. A leader registers (POST /register_rank) before it "
                "reports or asks"
            )

    def _check_leader_info(self, info: RankInfo) -> None:
        """Protocol 2: a registering rank must be a leader and speak for its block."""
        if self.leaders is None:
            if info.replicas is not None:
                raise InvalidRankError(
                    f"Rank {info.rank} registered with replicas, which only the leaders of a "
                    f"protocol-2 job send; job {self.job_id} runs protocol 1 (every rank "
                    "registers for itself)"
                )
            return
        if not self.leaders.is_leader(dp_rank=info.dp_rank, tp_rank=info.tp_rank):
            raise InvalidRankError(
                f"Rank {info.rank} (dp_rank {info.dp_rank}, pp_rank {info.pp_rank}, tp_rank "
                f"{info.tp_rank}) is not a leader of job {self.job_id}: {self.leaders.rule}"
            )
        block = list(self.leaders.block(info.dp_rank))
        if info.replicas != block:
            said = "none" if info.replicas is None else ranks_text(info.replicas)
            raise InvalidRankError(
                f"Leader rank {info.rank} (dp_rank {info.dp_rank}, pp_rank {info.pp_rank}) of "
                f"job {self.job_id} says it speaks for replicas {said}, but with "
                f"{self.leaders.per_stage} leader(s) per stage it speaks for replicas "
                f"{ranks_text(block)}"
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
            if self.dumping and self.dir.path.is_dir():
                # Small and rare: written at once, so a restart never revives the job.
                with contextlib.suppress(OSError):
                    status = status_of(JobStateError(str(error), cause=error))
                    atomic_write_text(self.dir.failed, f"{status} {error}\n")
            if self.on_end is not None:
                self.on_end(self)
        if self.round.timer is not None:
            self.round.timer.cancel()

    def _spawn(self, coro: Any) -> None:
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
                f"(its degree is {degree}; valid 0..{degree - 1})"
            )
        self._check_leader_info(info)
        self.check_usable()
        if not info.available_frequencies or min(info.available_frequencies) <= 0:
            raise InvalidRankError(
                f"Rank {info.rank}: available_frequencies must be a non-empty list of positive "
                f"MHz values, got {info.available_frequencies!r}"
            )
        if info.rank in self.ranks:
            if self.ranks[info.rank] == info:
                return  # the same registration again (a retry after a lost answer)
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
        complete = len(self.ranks) == self.talking_ranks  # decided before any await
        if self.dumping:  # on disk before the rank hears back: a restart keeps it
            line = info.model_dump_json()
            await self._dump(asyncio.to_thread(self.dir.append_registration, line))
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
                _fail_round(self.round, error)
                raise error from None
        self.phase = JobPhase.RUNNING
        if self.dumping:
            await self._dump(save_ranks(rank_infos, self.dir.path))
            await self._dump(asyncio.to_thread(self.dir.registering.unlink, missing_ok=True))
        logger.info(
            "Job %s: all %d %s registered",
            self.job_id,
            len(rank_infos),
            "ranks" if self.leaders is None else "leaders",
        )
        self._maybe_complete()

    # ------------------------------------------------------------------ rounds
    async def get_schedule(self, rank: int) -> FrequencySchedule:
        self.touch()
        self.check_rank(rank)
        self.check_talker(rank)
        self.check_usable()
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
            or len(rnd.asked) < self.talking_ranks
        ):
            return
        rnd.completing = True
        if rnd.timer is not None:
            rnd.timer.cancel()
        self._spawn(self._complete(rnd))

    def _on_timeout(self, rnd: Round) -> None:
        if (
            rnd is not self.round
            or rnd.completing
            or rnd.future.done()
            or self.phase is JobPhase.FINISHED
        ):
            return
        message = (
            f"Round {rnd.number} of job {self.job_id} timed out after {self.round_timeout_s:g} s: "
        )
        if self.leaders is None:
            never_asked = sorted(set(range(self.info.world_size)) - rnd.asked)
            unregistered = sorted(set(range(self.info.world_size)) - set(self.ranks))
            message += f"rank(s) {ranks_text(never_asked)} never asked for their schedule"
            if unregistered:
                message += f"; rank(s) {ranks_text(unregistered)} never registered"
        else:
            never_asked = sorted(set(self.ranks) - rnd.asked)
            message += f"leader rank(s) {ranks_text(never_asked)} never asked for their schedule"
            seen = {(i.pp_rank, i.dp_rank) for i in self.ranks.values()}
            missing = [
                f"stage {p} replica {d}"
                for p in range(self.info.pp_degree)
                for d in self.leaders.replicas
                if (p, d) not in seen
            ]
            if missing:
                shown = ", ".join(missing[:8]) + (
                    f" and {len(missing) - 8} more" if len(missing) > 8 else ""
                )
                message += f"; the leader(s) of {shown} never registered"
        error = RoundTimeoutError(message, job_id=self.job_id)
        self.fail(error)
        _fail_round(rnd, error)

    def _run_scheduler(
        self, results: list[ProfilingResult], round_number: int
    ) -> tuple[list[FrequencySchedule], Plan | None, Plan | None, RoundKind]:
        """Worker thread: observe the last round, produce the next one (with the deployed
        and the all-max plan, and what the schedules run, for the energy report)."""
        assert self.scheduler is not None
        if results:
            self.scheduler.observe(results)
        schedules = self.scheduler.next_schedule()
        status = self.scheduler.status()
        if status is not None and schedules:
            # The first talking rank (rank 0) tells the job's story; the others need not
            # carry it.
            first = min(s.rank for s in schedules)
            schedules = [
                s.model_copy(update={"status": status}) if s.rank == first else s for s in schedules
            ]
        self.stats.promise_events(self.scheduler.promise_events())
        plan = self.scheduler.deployed_plan()
        if plan is not None and self.emulated and not plan.emulated:
            plan = plan.model_copy(update={"emulated": True})  # the persisted plan says so
        try:
            baseline = self.scheduler.baseline_plan()
        except Exception as exc:  # the report's baseline must never fail a round
            logger.warning("Job %s: no predicted all-max baseline: %s", self.job_id, exc)
            baseline = None
        if self._rank_max is None:  # every rank has registered: fixed from now on
            self._rank_max = {r: max(i.available_frequencies) for r, i in self.ranks.items()}
            self._rank_pp = {r: i.pp_rank for r, i in self.ranks.items()}
        kind = round_kind(schedules, max_freq=self._rank_max, pp_rank=self._rank_pp, plan=plan)
        return schedules, plan, baseline, kind

    async def _complete(self, rnd: Round) -> None:
        results = [self.results[r] for r in sorted(self.results)]
        self.results = {}
        results_dumped, self._results_dumped = self._results_dumped, False
        name = self.scheduler_cls.__name__
        started = time.perf_counter()
        try:
            async with self.lock:
                schedules, plan, baseline, kind = await asyncio.to_thread(
                    self._run_scheduler, results, rnd.number
                )
            by_rank = {s.rank: s for s in schedules}
            expected = set(range(self.info.world_size)) if self.leaders is None else set(self.ranks)
            missing = sorted(expected - set(by_rank))
            if missing or len(schedules) != self.talking_ranks:
                raise RuntimeError(
                    f"it returned {len(schedules)} schedule(s) for {self.talking_ranks} talking "
                    f"rank(s) (missing ranks {ranks_text(missing)})"
                )
        except Exception as exc:
            error = SchedulerFailedError(
                f"Scheduler {name} failed in round {rnd.number} of job {self.job_id}: {exc}",
                job_id=self.job_id,
                cause=exc,
            )
            if status_of(error) >= 500:
                logger.error("Job %s: scheduler crashed", self.job_id, exc_info=exc)
            self.fail(error)
            _fail_round(rnd, error)
            return
        if self.dumping:
            if results and not results_dumped:
                await self._dump(save_prof(results, self.dir.path, rnd.number - 1))
            await self._dump(save_sched(schedules, self.dir.path, rnd.number))
        if kind in self.report_rounds:
            self.report_rounds[kind].append(rnd.number)
        if self.dumping:
            if self.settings.dump_keep_rounds:
                protect = {n for rounds in self.report_rounds.values() for n in rounds}
                await self._dump(
                    asyncio.to_thread(
                        self.dir.prune_rounds, self.settings.dump_keep_rounds, protect
                    )
                )
            if plan is not None:
                text = plan.model_dump_json() + "\n"
                if text != self._persisted_plan:
                    if baseline is not None:  # first: the report reads both as a pair
                        await self._dump(
                            asyncio.to_thread(
                                atomic_write_text,
                                self.dir.baseline_plan,
                                baseline.model_dump_json() + "\n",
                            )
                        )
                    await self._dump(
                        asyncio.to_thread(atomic_write_text, self.dir.deployed_plan, text)
                    )
                    self._persisted_plan = text
        self.round = self._new_round(rnd.number + 1)
        self.touch()
        latency_s = time.perf_counter() - started
        self.stats.round_issued(
            rnd.number, kind, plan=plan, baseline_plan=baseline, latency_s=latency_s
        )
        if self.on_round is not None:
            self.on_round(self, latency_s)
        rnd.future.set_result(by_rank)

    async def _dump(self, awaitable: Any) -> None:
        try:
            await awaitable
        except OSError as exc:
            logger.error("Job %s: could not write the dump: %s", self.job_id, exc)

    # ------------------------------------------------------------------ results & stragglers
    async def report_result(self, result: ProfilingResult) -> None:
        self.touch()
        self.check_rank(result.rank)
        self.check_talker(result.rank)
        if self.phase is not JobPhase.FINISHED:  # a finished job takes its last round's
            self.check_usable()
        self._check_replicas(result)
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
            if self.results[result.rank] == result:
                return  # the same result again (a retry after a lost answer)
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
        self.stats.add(self.round.number - 1, result)
        if self.dumping and len(self.results) == self.talking_ranks:
            # The round's results are complete: write them now, not when the next round
            # starts (the job's last round has no next round).
            self._results_dumped = True
            results = [self.results[r] for r in sorted(self.results)]
            await self._dump(save_prof(results, self.dir.path, self.round.number - 1))

    def _check_replicas(self, result: ProfilingResult) -> None:
        """A leader's result holds one `ReplicaFigures` per replica of its block, in order;
        a protocol-1 rank's none."""
        got = [f.dp_rank for f in result.replicas]
        if self.leaders is None:
            if got:
                raise InvalidResultError(
                    f"Rank {result.rank} reported replicas, which only the leaders of a "
                    f"protocol-2 job report; job {self.job_id} runs protocol 1"
                )
            return
        info = self.ranks[result.rank]
        block = list(self.leaders.block(info.dp_rank))
        if got != block:
            raise InvalidResultError(
                f"Result of leader rank {result.rank} for round {self.round.number - 1} of job "
                f"{self.job_id} refused: it holds figures of replicas "
                f"{ranks_text(got) if got else 'none'}; a leader reports one entry per "
                f"replica it speaks for, in order: {ranks_text(block)}"
            )

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
            _fail_round(
                rnd,
                JobStateError(
                    f"Job {self.job_id} finished before round {rnd.number} ran",
                    job_id=self.job_id,
                ),
            )
        if self.dumping and self.dir.path.is_dir():
            with contextlib.suppress(OSError):  # small: written at once, never restored
                atomic_write_text(self.dir.finished, f"finished after round {rnd.number - 1}\n")
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
        """Fail the pending round (shutdown or eviction) and cancel its timer."""
        _fail_round(self.round, error)
