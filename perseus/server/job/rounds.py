"""A job's scheduling rounds: the barrier, the scheduler's turn, and the ranks' results.

A round is a barrier (`Round`): every talking rank's ``GET /schedule`` awaits the round's
future. When the last one has asked (and every one has registered), one task observes the
previous round's results, asks the scheduler for the next schedules and resolves the
future. If the barrier is not complete `round_timeout_s` after the round's first request,
a timer fails the future (504 for every waiting rank) and the job (409 afterwards).

`JobRounds` is the part of `perseus.server.job.CoordinatedJob` that runs its rounds: it owns
the round in progress, the results that arrived for the previous one and the rounds the
energy report keeps; it reads the rest of the job through `RoundsHost` (the job's public
side) and never sets it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from perseus.domain.layout import Leaders
from perseus.domain.plan import Plan
from perseus.errors import (
    InvalidResultError,
    JobError,
    PerseusError,
    RankConflictError,
    RoundTimeoutError,
    SchedulerFailedError,
)
from perseus.planning.report import REPORT_WINDOW, RoundKind, round_kind
from perseus.protocol import FrequencySchedule, JobRecord, ProfilingResult, RankInfo
from perseus.schedulers.base import FrequencyScheduler
from perseus.server.errors import status_of
from perseus.server.job.barrier import JobPhase, Round, fail_round, ranks_text, timeout_message
from perseus.server.job.dump import JobDump
from perseus.server.job.leaders import check_result
from perseus.server.job.stats import JobStats

__all__ = ["JobRounds", "RoundsHost"]

logger = logging.getLogger(__name__)


class RoundsHost(Protocol):
    """What a job lends its rounds (`perseus.server.job.CoordinatedJob`): read, never set."""

    info: JobRecord
    job_id: str
    leaders: Leaders | None
    talking_ranks: int
    round_timeout_s: float
    ranks: dict[int, RankInfo]
    scheduler: FrequencyScheduler | None
    scheduler_cls: type
    phase: JobPhase
    lock: asyncio.Lock
    dump: JobDump
    stats: JobStats
    on_round: Callable[[Any, float], None] | None

    @property
    def emulated(self) -> bool: ...

    def touch(self) -> None: ...

    def check_rank(self, rank: int) -> None: ...

    def check_talker(self, rank: int) -> None: ...

    def check_usable(self) -> None: ...

    def fail(self, error: JobError) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None: ...


class JobRounds:
    """The rounds of one job: the barrier in progress (`current`), the results of the
    previous round as they arrive, and the newest all-max and deployed rounds (the energy
    report's, never pruned)."""

    def __init__(self, job: RoundsHost) -> None:
        self._job = job
        self.current = self._new_round(0)
        """The round whose schedules the talking ranks wait for."""
        self.results: dict[int, ProfilingResult] = {}
        """The previous round's results, by rank, as they arrive."""
        self._results_dumped = False
        """The current `results` (all ranks) were written when the last one arrived."""
        keep = REPORT_WINDOW + 1  # round 0 is all-max but no report's
        self.report_rounds: dict[RoundKind, deque[int]] = {
            RoundKind.ALL_MAX: deque(maxlen=keep),
            RoundKind.DEPLOYED: deque(maxlen=keep),
        }
        """The newest all-max and deployed rounds: the energy report's, never pruned."""
        self._rank_max: dict[int, int] | None = None
        self._rank_pp: dict[int, int] = {}

    @staticmethod
    def _new_round(number: int) -> Round:
        return Round(number, asyncio.get_running_loop().create_future())

    def restart_at(self, number: int) -> None:
        """A restored job (`perseus.server.job_manager`) goes on from round `number`."""
        self.current = self._new_round(number)

    @property
    def busy(self) -> bool:
        """A round's schedules are being computed."""
        return self.current.completing

    async def get_schedule(self, rank: int) -> FrequencySchedule:
        self._job.touch()
        self._job.check_rank(rank)
        self._job.check_talker(rank)
        self._job.check_usable()
        rnd = self.current
        rnd.asked.add(rank)
        if rnd.timer is None and not rnd.completing:
            rnd.timer = asyncio.get_running_loop().call_later(
                self._job.round_timeout_s, self._on_timeout, rnd
            )
        self.maybe_complete()
        schedules = await asyncio.shield(rnd.future)
        return schedules[rank]

    def maybe_complete(self) -> None:
        """Complete the round if every talking rank has asked and the job has a scheduler."""
        rnd = self.current
        if (
            self._job.scheduler is None
            or rnd.completing
            or rnd.future.done()
            or len(rnd.asked) < self._job.talking_ranks
        ):
            return
        rnd.completing = True
        if rnd.timer is not None:
            rnd.timer.cancel()
        self._job.spawn(self._complete(rnd, self._job.scheduler))

    def _on_timeout(self, rnd: Round) -> None:
        if (
            rnd is not self.current
            or rnd.completing
            or rnd.future.done()
            or self._job.phase is JobPhase.FINISHED
        ):
            return
        job = self._job
        message = timeout_message(job.info, job.leaders, job.ranks, rnd, job.round_timeout_s)
        error = RoundTimeoutError(message, job_id=self._job.job_id)
        self._job.fail(error)
        fail_round(rnd, error)

    def _run_scheduler(
        self, scheduler: FrequencyScheduler, results: list[ProfilingResult]
    ) -> tuple[list[FrequencySchedule], Plan | None, Plan | None, RoundKind]:
        """Worker thread: observe the last round, produce the next one (with the deployed
        and the all-max plan, and what the schedules run, for the energy report)."""
        if results:
            scheduler.observe(results)
        schedules = scheduler.next_schedule()
        report = scheduler.report()
        if report.status is not None and schedules:
            # The first talking rank (rank 0) tells the job's story; the others need not
            # carry it.
            first = min(s.rank for s in schedules)
            schedules = [
                s.model_copy(update={"status": report.status}) if s.rank == first else s
                for s in schedules
            ]
        self._job.stats.promise_events(report.events)
        plan, baseline = report.plan, report.baseline
        if plan is not None and self._job.emulated and not plan.emulated:
            plan = plan.model_copy(update={"emulated": True})  # the persisted plan says so
        if self._rank_max is None:  # every rank has registered: fixed from now on
            self._rank_max = {r: max(i.available_frequencies) for r, i in self._job.ranks.items()}
            self._rank_pp = {r: i.pp_rank for r, i in self._job.ranks.items()}
        kind = round_kind(schedules, max_freq=self._rank_max, pp_rank=self._rank_pp, plan=plan)
        return schedules, plan, baseline, kind

    async def _complete(self, rnd: Round, scheduler: FrequencyScheduler) -> None:
        results = [self.results[r] for r in sorted(self.results)]
        self.results = {}
        results_dumped, self._results_dumped = self._results_dumped, False
        name = self._job.scheduler_cls.__name__
        started = time.perf_counter()
        try:
            async with self._job.lock:
                schedules, plan, baseline, kind = await asyncio.to_thread(
                    self._run_scheduler, scheduler, results
                )
            by_rank = {s.rank: s for s in schedules}
            expected = (
                set(range(self._job.info.world_size))
                if self._job.leaders is None
                else set(self._job.ranks)
            )
            missing = sorted(expected - set(by_rank))
            if missing or len(schedules) != self._job.talking_ranks:
                raise RuntimeError(
                    f"it returned {len(schedules)} schedule(s) for {self._job.talking_ranks} talking "
                    f"rank(s) (missing ranks {ranks_text(missing)})"
                )
        except Exception as exc:
            error = SchedulerFailedError(
                f"Scheduler {name} failed in round {rnd.number} of job {self._job.job_id}: {exc}",
                job_id=self._job.job_id,
                cause=exc,
            )
            if status_of(error) >= 500:
                logger.error("Job %s: scheduler crashed", self._job.job_id, exc_info=exc)
            self._job.fail(error)
            fail_round(rnd, error)
            return
        if results and not results_dumped:
            await self._job.dump.results(rnd.number - 1, results)
        await self._job.dump.schedules(rnd.number, schedules)
        if kind in self.report_rounds:
            self.report_rounds[kind].append(rnd.number)
        await self._job.dump.prune({n for rounds in self.report_rounds.values() for n in rounds})
        if plan is not None:
            await self._job.dump.plans(plan, baseline)
        self.current = self._new_round(rnd.number + 1)
        self._job.touch()
        latency_s = time.perf_counter() - started
        self._job.stats.round_issued(
            rnd.number, kind, plan=plan, baseline_plan=baseline, latency_s=latency_s
        )
        if self._job.on_round is not None:
            self._job.on_round(self._job, latency_s)
        rnd.future.set_result(by_rank)

    # ------------------------------------------------------------------ results & stragglers
    async def report_result(self, result: ProfilingResult) -> None:
        self._job.touch()
        self._job.check_rank(result.rank)
        self._job.check_talker(result.rank)
        if self._job.phase is not JobPhase.FINISHED:  # a finished job takes its last round's
            self._job.check_usable()
        check_result(
            self._job.job_id,
            self._job.leaders,
            self._job.ranks.get(result.rank),
            self.current.number - 1,
            result,
        )
        if self.current.number == 0:
            raise RankConflictError(
                f"Rank {result.rank} reported a result for job {self._job.job_id} before any "
                "schedule was handed out; ask for a schedule, run it, then report",
                rank=result.rank,
            )
        if result.rank in self.current.asked:
            raise RankConflictError(
                f"Rank {result.rank} already asked for round {self.current.number}'s schedule of "
                f"job {self._job.job_id}; report round {self.current.number - 1}'s result before asking",
                rank=result.rank,
            )
        if result.rank in self.results:
            if self.results[result.rank] == result:
                return  # the same result again (a retry after a lost answer)
            raise RankConflictError(
                f"Rank {result.rank} already reported its result for round "
                f"{self.current.number - 1} of job {self._job.job_id}; report once per round",
                rank=result.rank,
            )
        if self._job.scheduler is not None:
            # Shapes against the job's schedule, before the result is kept: a refused result
            # leaves the job as it was, and the rank may send a corrected one.
            try:
                self._job.scheduler.check_result(result)
            except (PerseusError, ValueError) as exc:
                raise InvalidResultError(
                    f"Result of rank {result.rank} for round {self.current.number - 1} of job "
                    f"{self._job.job_id} refused: {exc}",
                    rank=result.rank,
                ) from None
        self.results[result.rank] = result
        self._job.stats.add(self.current.number - 1, result)
        if self._job.dump.enabled and len(self.results) == self._job.talking_ranks:
            # The round's results are complete: write them now, not when the next round
            # starts (the job's last round has no next round).
            self._results_dumped = True
            results = [self.results[r] for r in sorted(self.results)]
            await self._job.dump.results(self.current.number - 1, results)
