"""SQLAlchemy tables and the engine factory of the batch-size optimizer server.

Concurrency comes from the database, not from process-local locks: on SQLite every
transaction starts with `BEGIN IMMEDIATE` (one writer at a time, readers see committed
state), on PostgreSQL the job row is locked with `SELECT ... FOR UPDATE`. Two clients
racing on a job therefore serialise on that job.
"""

from __future__ import annotations

from datetime import datetime, timezone

from pydantic import ValidationError
from sqlalchemy import (
    Engine,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.pool import StaticPool

from zeus_power.bso.models import JobConfig, TrialRecord
from zeus_power.errors import ZeusBSORuntimeError, ZeusConfigError

__all__ = ["Base", "JobRow", "TrialRow", "make_engine"]


def _now() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    """Declarative base of the server's tables."""


class JobRow(Base):
    """A registered job; its config is the validated `JobConfig` as JSON."""

    __tablename__ = "bso_jobs"

    job_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    config_json: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=_now)

    def config(self) -> JobConfig:
        """The job's `JobConfig`; `ZeusBSORuntimeError` when the stored one is invalid."""
        try:
            return JobConfig.model_validate_json(self.config_json)
        except ValidationError as exc:
            raise ZeusBSORuntimeError(
                f"Stored config of job {self.job_id!r} is invalid: {exc}"
            ) from exc


class TrialRow(Base):
    """One trial of a job: handed out, then reported once."""

    __tablename__ = "bso_trials"
    __table_args__ = (UniqueConstraint("job_id", "trial_number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("bso_jobs.job_id", ondelete="CASCADE"))
    trial_number: Mapped[int]
    batch_size: Mapped[int]
    stage: Mapped[str] = mapped_column(String(16))
    round: Mapped[int | None]
    status: Mapped[str] = mapped_column(String(16))
    energy_j: Mapped[float | None]
    time_s: Mapped[float | None]
    cost: Mapped[float | None]
    converged: Mapped[bool | None]
    epochs: Mapped[int | None]
    created_at: Mapped[datetime] = mapped_column(default=_now)
    finished_at: Mapped[datetime | None]

    def record(self) -> TrialRecord:
        """This trial as the API answers it."""
        return TrialRecord(
            job_id=self.job_id,
            trial_number=self.trial_number,
            batch_size=self.batch_size,
            stage=self.stage,  # type: ignore[arg-type]
            round=self.round,
            status=self.status,  # type: ignore[arg-type]
            energy_j=self.energy_j,
            time_s=self.time_s,
            cost=self.cost,
            converged=self.converged,
            epochs=self.epochs,
        )


def make_engine(db_url: str, *, sqlite_busy_timeout_s: float = 30.0) -> Engine:
    """Build the engine for `db_url`; on SQLite, make every transaction `BEGIN IMMEDIATE`."""
    try:
        url = make_url(db_url)
        if url.get_backend_name() != "sqlite":
            return create_engine(url, pool_pre_ping=True)
    except (ArgumentError, ImportError) as exc:
        raise ZeusConfigError(
            f"Cannot use database URL {db_url!r}: {exc}. Use e.g. sqlite:///./zeus_bso.db or "
            "postgresql+psycopg://user:password@host/db (pip install 'psycopg[binary]')."
        ) from exc

    in_memory = url.database in (None, "", ":memory:")
    engine = create_engine(
        url,
        connect_args={"check_same_thread": False, "timeout": sqlite_busy_timeout_s},
        poolclass=StaticPool if in_memory else None,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
        # Let SQLAlchemy, not pysqlite, decide when transactions begin (SQLAlchemy docs,
        # "Serializable isolation / Savepoints / Transactional DDL" for pysqlite).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        if not in_memory:
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn) -> None:  # type: ignore[no-untyped-def]
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine
