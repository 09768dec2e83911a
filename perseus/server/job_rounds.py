"""A job's scheduling rounds: the barrier, the scheduler's turn, and the ranks' results.

A round is a barrier (`Round`): every talking rank's ``GET /schedule`` awaits the round's
future. When the last one has asked (and every one has registered), one task observes the
previous round's results, asks the scheduler for the next schedules and resolves the
future. If the barrier is not complete `round_timeout_s` after the round's first request,
a timer fails the future (504 for every waiting rank) and the job (409 afterwards).

`RoundBarrier` is the part of `perseus.server.job.CoordinatedJob` that runs rounds; it
holds no state of its own (the attributes below are the job's).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

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
from perseus.planning.report import RoundKind, round_kind
from perseus.protocol import FrequencySchedule, JobRecord, ProfilingResult, RankInfo
from perseus.schedulers.base import FrequencyScheduler
from perseus.server.barrier import JobPhase, Round, fail_round, ranks_text, timeout_message
from perseus.server.errors import status_of
from perseus.server.job_dump import JobDump
from perseus.server.leaders import check_result
from perseus.server.stats import JobStats

__all__ = ["RoundBarrier"]

logger = logging.getLogger(__name__)


class RoundBarrier:
    """Rounds of one job (mixed into `CoordinatedJob`, which owns the state)."""

    info: JobRecord
    job_id: str
    leaders: Leaders | None
    talking_ranks: int
    round_timeout_s: float
    ranks: dict[int, RankInfo]
    scheduler: FrequencyScheduler | None
    scheduler_cls: type
    phase: JobPhase
    results: dict[int, ProfilingResult]
    round: Round
    lock: asyncio.Lock
    dump: JobDump
    stats: JobStats
    report_rounds: dict[RoundKind, deque[int]]
    on_round: Callable[[Any, float], None] | None
    _results_dumped: bool
    _rank_max: dict[int, int] | None
    _rank_pp: dict[int, int]

    # The job's own methods, used here (`perseus.server.job.CoordinatedJob`).
    touch: Callable[[], None]
    check_rank: Callable[[int], None]
    check_talker: Callable[[int], None]
    check_usable: Callable[[], None]
    fail: Callable[[JobError], None]
    _spawn: Callable[[Any], None]
    _new_round: Callable[[int], Round]

    @property
    def emulated(self) -> bool:
        """Some rank registered an emulated GPU: the job's numbers are the emulator's."""
        return any(info.emulated for info in self.ranks.values())

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
        self._spawn(self._complete(rnd, self.scheduler))

    def _on_timeout(self, rnd: Round) -> None:
        if (
            rnd is not self.round
            or rnd.completing
            or rnd.future.done()
            or self.phase is JobPhase.FINISHED
        ):
            return
        message = timeout_message(self.info, self.leaders, self.ranks, rnd, self.round_timeout_s)
        error = RoundTimeoutError(message, job_id=self.job_id)
        self.fail(error)
        fail_round(rnd, error)

    def _run_scheduler(
        self, scheduler: FrequencyScheduler, results: list[ProfilingResult]
    ) -> tuple[list[FrequencySchedule], Plan | None, Plan | None, RoundKind]:
        """Worker thread: observe the last round, produce the next one (with the deployed
        and the all-max plan, and what the schedules run, for the energy report)."""
        if results:
            scheduler.observe(results)
        schedules = scheduler.next_schedule()
        status = scheduler.status()
        if status is not None and schedules:
            # The first talking rank (rank 0) tells the job's story; the others need not
            # carry it.
            first = min(s.rank for s in schedules)
            schedules = [
                s.model_copy(update={"status": status}) if s.rank == first else s for s in schedules
            ]
        self.stats.promise_events(scheduler.promise_events())
        plan = scheduler.deployed_plan()
        if plan is not None and self.emulated and not plan.emulated:
            plan = plan.model_copy(update={"emulated": True})  # the persisted plan says so
        try:
            baseline = scheduler.baseline_plan()
        except Exception as exc:  # the report's baseline must never fail a round
            logger.warning("Job %s: no predicted all-max baseline: %s", self.job_id, exc)
            baseline = None
        if self._rank_max is None:  # every rank has registered: fixed from now on
            self._rank_max = {r: max(i.available_frequencies) for r, i in self.ranks.items()}
            self._rank_pp = {r: i.pp_rank for r, i in self.ranks.items()}
        kind = round_kind(schedules, max_freq=self._rank_max, pp_rank=self._rank_pp, plan=plan)
        return schedules, plan, baseline, kind

    async def _complete(self, rnd: Round, scheduler: FrequencyScheduler) -> None:
        results = [self.results[r] for r in sorted(self.results)]
        self.results = {}
        results_dumped, self._results_dumped = self._results_dumped, False
        name = self.scheduler_cls.__name__
        started = time.perf_counter()
        try:
            async with self.lock:
                schedules, plan, baseline, kind = await asyncio.to_thread(
                    self._run_scheduler, scheduler, results
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
            fail_round(rnd, error)
            return
        if results and not results_dumped:
            await self.dump.results(rnd.number - 1, results)
        await self.dump.schedules(rnd.number, schedules)
        if kind in self.report_rounds:
            self.report_rounds[kind].append(rnd.number)
        await self.dump.prune({n for rounds in self.report_rounds.values() for n in rounds})
        if plan is not None:
            await self.dump.plans(plan, baseline)
        self.round = self._new_round(rnd.number + 1)
        self.touch()
        latency_s = time.perf_counter() - started
        self.stats.round_issued(
            rnd.number, kind, plan=plan, baseline_plan=baseline, latency_s=latency_s
        )
        if self.on_round is not None:
            self.on_round(self, latency_s)
        rnd.future.set_result(by_rank)

    # ------------------------------------------------------------------ results & stragglers
    async def report_result(self, result: ProfilingResult) -> None:
        self.touch()
        self.check_rank(result.rank)
        self.check_talker(result.rank)
        if self.phase is not JobPhase.FINISHED:  # a finished job takes its last round's
            self.check_usable()
        check_result(
            self.job_id, self.leaders, self.ranks.get(result.rank), self.round.number - 1, result
        )
        if self.round.number == 0:
            raise RankConflictError(
                f"Rank {result.rank} reported a result for job {self.job_id} before any "
                "schedule was handed out; ask for a schedule, run it, then report",
                rank=result.rank,
            )
        if result.rank in self.round.asked:
            raise RankConflictError(
                f"Rank {result.rank} already asked for round {self.round.number}'s schedule of "
                f"job {self.job_id}; report round {self.round.number - 1}'s result before asking",
                rank=result.rank,
            )
        if result.rank in self.results:
            if self.results[result.rank] == result:
                return  # the same result again (a retry after a lost answer)
            raise RankConflictError(
                f"Rank {result.rank} already reported its result for round "
                f"{self.round.number - 1} of job {self.job_id}; report once per round",
                rank=result.rank,
            )
        if self.scheduler is not None:
            # Shapes against the job's schedule, before the result is kept: a refused result
            # leaves the job as it was, and the rank may send a corrected one.
            try:
                self.scheduler.check_result(result)
            except (PerseusError, ValueError) as exc:
                raise InvalidResultError(
                    f"Result of rank {result.rank} for round {self.round.number - 1} of job "
                    f"{self.job_id} refused: {exc}",
                    rank=result.rank,
                ) from None
        self.results[result.rank] = result
        self.stats.add(self.round.number - 1, result)
        if self.dump.enabled and len(self.results) == self.talking_ranks:
            # The round's results are complete: write them now, not when the next round
            # starts (the job's last round has no next round).
            self._results_dumped = True
            results = [self.results[r] for r in sorted(self.results)]
            await self.dump.results(self.round.number - 1, results)
