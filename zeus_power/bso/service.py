"""The batch-size optimizer service: the one implementation of the job/trial logic.

Everything that hands out, reports, ends or expires a trial is here, and only here: the
server's own routes (`zeus_power.bso.server.routes.jobs`), its Zeus-compatible routes
(`zeus_power.bso.server.routes.zeus`) and the in-process optimizer
(`zeus_power.bso.local.LocalBatchSizeOptimizer`, this service over an in-memory SQLite
database) all call it, so trial numbering (1, 2, ... per job), expiry (`trial_timeout_s`)
and the policy's decisions cannot differ between them.

Every public method is one database transaction: it locks the job (see `db`), reads its
trials, lets `zeus_power.bso.policy` decide, and writes the result. SQLAlchemy errors
become `ZeusBSORuntimeError` here and nowhere else.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TypeVar

from sqlalchemy import Engine, func, select
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from zeus_power.bso.db import Base, JobRow, TrialRow
from zeus_power.bso.models import (
    JobConfig,
    JobState,
    TrialAssignment,
    TrialRecord,
    TrialResult,
)
from zeus_power.bso.policy import EpochVerdict, cost_bound, decide, epoch_verdict, job_state
from zeus_power.errors import (
    ZeusBSOConfigError,
    ZeusBSOConflictError,
    ZeusBSOError,
    ZeusBSOJobNotFoundError,
    ZeusBSORuntimeError,
    ZeusBSOTrialNotFoundError,
)
from zeus_power.metric import zeus_cost

__all__ = ["BSOService"]

logger = logging.getLogger("zeus_power.bso.server")

_T = TypeVar("_T")


class BSOService:
    """Jobs and trials of the batch-size optimizer, kept in a SQL database.

    Args:
        engine: The database (`zeus_power.bso.db.make_engine`).
        trial_timeout_s: A trial not reported this long after it was handed out is marked
            `timed_out` when the job's next trial is asked for (None: never).
    """

    def __init__(self, engine: Engine, *, trial_timeout_s: float | None = None) -> None:
        self._engine = engine
        self._trial_timeout_s = trial_timeout_s
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        # One shared connection (an in-memory SQLite database) cannot hold two transactions
        # at once: threads take turns. Other engines give each transaction its own connection
        # and the database serialises writers (see `db`).
        self._one_at_a_time: contextlib.AbstractContextManager[object] = (
            threading.Lock() if isinstance(engine.pool, StaticPool) else contextlib.nullcontext()
        )

    def create_tables(self) -> None:
        """Create the tables if they do not exist."""
        self._guard(lambda: Base.metadata.create_all(self._engine))

    # ----------------------------------------------------------------- public API

    def register_job(self, config: JobConfig) -> tuple[JobState, bool]:
        """Register `config`, or check it against the registered one.

        Returns the job state and whether the job was created now.

        Raises:
            ZeusBSOConfigError: The job id is registered with a different config.
        """

        def run(session: Session) -> tuple[JobState, bool]:
            row = self._lock_job(session, config.job_id)
            if row is None:
                session.add(JobRow(job_id=config.job_id, config_json=config.model_dump_json()))
                session.flush()
                return self._state(config, []), True
            registered = row.config()
            if registered != config:
                diff = {
                    key: (value, getattr(config, key))
                    for key, value in registered.model_dump().items()
                    if getattr(config, key) != value
                }
                raise ZeusBSOConfigError(
                    f"Job {config.job_id!r} is registered with a different config; "
                    f"(registered, given) values differ for {diff}. Use the registered "
                    f"config or a new job_id."
                )
            return self._state(registered, self._trials(session, config.job_id)), False

        try:
            return self._transaction(run)
        except ZeusBSORuntimeError as exc:
            # Two first registrations raced (PostgreSQL): the loser re-reads and compares.
            if isinstance(exc.__cause__, IntegrityError):
                return self._transaction(run)
            raise

    def get_job(self, job_id: str) -> JobState:
        """The job's config and exploration state."""

        def run(session: Session) -> JobState:
            config = self._require_job(session, job_id, lock=False).config()
            return self._state(config, self._trials(session, job_id))

        return self._transaction(run)

    def list_trials(self, job_id: str) -> list[TrialRecord]:
        """All trials of the job, by trial number."""

        def run(session: Session) -> list[TrialRecord]:
            self._require_job(session, job_id, lock=False)
            return self._trials(session, job_id)

        return self._transaction(run)

    def next_trial(self, job_id: str) -> TrialAssignment:
        """Decide the next batch size for the job and record the trial as dispatched.

        Raises:
            ZeusBSOJobNotFoundError: Unknown job.
            ZeusBSOConflictError: No batch size reached the target metric.
        """

        def run(session: Session) -> TrialAssignment:
            config = self._require_job(session, job_id, lock=True).config()
            self._expire_stale_trials(session, job_id)
            trials = self._trials(session, job_id)
            decision = decide(config, trials)
            number = (
                session.scalar(
                    select(func.max(TrialRow.trial_number)).where(TrialRow.job_id == job_id)
                )
                or 0
            ) + 1
            session.add(
                TrialRow(
                    job_id=job_id,
                    trial_number=number,
                    batch_size=decision.batch_size,
                    stage=decision.stage,
                    round=decision.round,
                    status="dispatched",
                )
            )
            cost_ub = cost_bound(config, trials)
            logger.info(
                "job %s trial %d: batch size %d (%s)",
                job_id,
                number,
                decision.batch_size,
                decision.stage,
            )
            return TrialAssignment(
                job_id=job_id,
                trial_number=number,
                batch_size=decision.batch_size,
                stage=decision.stage,
                round=decision.round,
                cost_ub=cost_ub,
            )

        return self._transaction(run)

    def report(self, job_id: str, trial_number: int, result: TrialResult) -> TrialRecord:
        """Record the result of a dispatched trial.

        Raises:
            ZeusBSOJobNotFoundError: Unknown job.
            ZeusBSOTrialNotFoundError: Unknown trial.
            ZeusBSOConflictError: The trial was already reported.
        """

        def run(session: Session) -> TrialRecord:
            config = self._require_job(session, job_id, lock=True).config()
            row = self._require_trial(session, job_id, trial_number)
            if row.status not in ("dispatched", "timed_out"):
                raise ZeusBSOConflictError(
                    f"Trial {trial_number} of job {job_id!r} was already reported "
                    f"({row.status}); a trial is reported once."
                )
            return self._finish(row, config, result)

        return self._transaction(run)

    def report_epoch(
        self,
        job_id: str,
        trial_number: int,
        *,
        batch_size: int | None = None,
        epochs: int,
        metric: float,
        time_s: float,
        energy_j: float,
    ) -> EpochVerdict:
        """One epoch of a running trial, with the time and energy spent so far: the policy
        (`epoch_verdict`, against β × the best cost now) says whether it goes on; when it
        stops, its result is recorded as `report` would. A trial that has its result
        already answers "stop" with that result (a client repeating its last report).

        Raises:
            ZeusBSOJobNotFoundError: Unknown job.
            ZeusBSOTrialNotFoundError: Unknown trial, or not of `batch_size`.
        """

        def run(session: Session) -> EpochVerdict:
            config = self._require_job(session, job_id, lock=True).config()
            row = self._require_trial(session, job_id, trial_number)
            if batch_size is not None and row.batch_size != batch_size:
                raise ZeusBSOTrialNotFoundError(
                    f"Trial {trial_number} of job {job_id!r} runs batch size {row.batch_size}, "
                    f"not {batch_size}; report the trial the server handed out."
                )
            if row.status not in ("dispatched", "timed_out"):
                return EpochVerdict(
                    stop=True,
                    converged=bool(row.converged),
                    reason=f"Trial {trial_number} already ended ({row.status}).",
                )
            verdict = epoch_verdict(
                config,
                epochs=epochs,
                metric=metric,
                time_s=time_s,
                energy_j=energy_j,
                cost_ub=cost_bound(config, self._trials(session, job_id)),
            )
            if verdict.stop:
                result = TrialResult(
                    energy_j=energy_j, time_s=time_s, converged=verdict.converged, epochs=epochs
                )
                self._finish(row, config, result)
            return verdict

        return self._transaction(run)

    def end_trial(
        self, job_id: str, trial_number: int, *, batch_size: int | None = None
    ) -> TrialRecord:
        """End a trial: one still waiting for its result fails (its batch size counts as not
        converging, as a report of no convergence would); one already ended is left as it is.

        Raises:
            ZeusBSOJobNotFoundError: Unknown job.
            ZeusBSOTrialNotFoundError: Unknown trial, or not of `batch_size`.
        """

        def run(session: Session) -> TrialRecord:
            self._require_job(session, job_id, lock=True)
            row = self._require_trial(session, job_id, trial_number)
            if batch_size is not None and row.batch_size != batch_size:
                raise ZeusBSOTrialNotFoundError(
                    f"Trial {trial_number} of job {job_id!r} runs batch size {row.batch_size}, "
                    f"not {batch_size}."
                )
            if row.status == "dispatched":
                row.status = "failed"
                row.finished_at = datetime.now(timezone.utc)
                session.flush()
                logger.info(
                    "job %s trial %d (batch size %d) ended without a result: failed",
                    job_id,
                    trial_number,
                    row.batch_size,
                )
            return row.record()

        return self._transaction(run)

    # ----------------------------------------------------------------- helpers

    def _transaction(self, fn: Callable[[Session], _T]) -> _T:
        def run() -> _T:
            with self._one_at_a_time, self._sessions.begin() as session:
                return fn(session)

        return self._guard(run)

    @staticmethod
    def _guard(fn: Callable[[], _T]) -> _T:
        try:
            return fn()
        except ZeusBSOError:
            raise
        except SQLAlchemyError as exc:
            raise ZeusBSORuntimeError(f"Database error: {type(exc).__name__}: {exc}") from exc

    def _expire_stale_trials(self, session: Session, job_id: str) -> None:
        """Mark trials dispatched longer ago than `trial_timeout_s` as `timed_out`."""
        if self._trial_timeout_s is None:
            return
        now = datetime.now(timezone.utc)
        rows = session.scalars(
            select(TrialRow).where(TrialRow.job_id == job_id, TrialRow.status == "dispatched")
        )
        for row in rows:
            created = row.created_at
            if created.tzinfo is None:  # SQLite returns naive datetimes; they were UTC
                created = created.replace(tzinfo=timezone.utc)
            if (now - created).total_seconds() > self._trial_timeout_s:
                row.status = "timed_out"
                row.finished_at = now
                logger.warning(
                    "job %s trial %d (batch size %d) timed out after %.0f s without a report; "
                    "its batch size will be handed out again",
                    job_id,
                    row.trial_number,
                    row.batch_size,
                    self._trial_timeout_s,
                )
        session.flush()

    @staticmethod
    def _require_trial(session: Session, job_id: str, trial_number: int) -> TrialRow:
        row = session.scalar(
            select(TrialRow).where(TrialRow.job_id == job_id, TrialRow.trial_number == trial_number)
        )
        if row is None:
            raise ZeusBSOTrialNotFoundError(
                f"Job {job_id!r} has no trial {trial_number}; name the trial_number the "
                "server handed out."
            )
        return row

    @staticmethod
    def _finish(row: TrialRow, config: JobConfig, result: TrialResult) -> TrialRecord:
        """Record `result` on a trial waiting for it (a late one after a timeout, too)."""
        if row.status == "timed_out":
            logger.warning(
                "job %s trial %d: late report accepted after the trial timed out",
                row.job_id,
                row.trial_number,
            )
        row.status = "succeeded" if result.converged else "failed"
        row.energy_j = result.energy_j
        row.time_s = result.time_s
        row.converged = result.converged
        row.epochs = result.epochs
        row.cost = zeus_cost(
            result.energy_j, result.time_s, config.eta_knob, config.total_max_power_w
        )
        row.finished_at = datetime.now(timezone.utc)
        return row.record()

    @staticmethod
    def _lock_job(session: Session, job_id: str) -> JobRow | None:
        return session.scalar(select(JobRow).where(JobRow.job_id == job_id).with_for_update())

    def _require_job(self, session: Session, job_id: str, *, lock: bool) -> JobRow:
        row = self._lock_job(session, job_id) if lock else session.get(JobRow, job_id)
        if row is None:
            raise ZeusBSOJobNotFoundError(job_id)
        return row

    @staticmethod
    def _trials(session: Session, job_id: str) -> list[TrialRecord]:
        rows = session.scalars(
            select(TrialRow).where(TrialRow.job_id == job_id).order_by(TrialRow.trial_number)
        )
        return [row.record() for row in rows]

    @staticmethod
    def _state(config: JobConfig, trials: list[TrialRecord]) -> JobState:
        return job_state(config, trials)
