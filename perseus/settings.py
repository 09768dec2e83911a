"""The coordinator's settings (``PERSEUS_*`` environment variables), as in Zeus's seed API."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["PerseusSettings"]


class PerseusSettings(BaseSettings):
    """Perseus settings, configurable via environment variables with the ``PERSEUS_`` prefix.

    The scheduler stays a name here: the coordinator resolves it (and checks
    `scheduler_args` against it) when it starts, through `schedulers.registry`, so that
    settings never import the schedulers.

    Attributes:
        scheduler: The scheduler's name: a registry name (``PERSEUS_SCHEDULER=AllMaxFrequency``)
            or a plugin given as ``package.module:Class``.
        scheduler_args: Extra keyword arguments for the scheduler, as JSON in the environment
            (``PERSEUS_SCHEDULER_ARGS='{"max_slowdown": 0.02}'``).
        log_level: Log level, e.g. "debug", "info".
        dump_data: Whether to dump internal state (ranks, schedules, results) to `dump_dir`.
        dump_dir: Directory to dump state in (if enabled).
        max_job_idle_time: Seconds a job may stay idle before the coordinator evicts it.
        dump_keep_rounds: With `dump_data`, how many rounds' schedules and results
            (``N.sched.json``, ``N.prof.json``) each job keeps; older ones are deleted as
            new rounds are written (``PERSEUS_DUMP_KEEP_ROUNDS``; 0 keeps every round).
    """

    model_config = SettingsConfigDict(env_prefix="PERSEUS_", extra="forbid", validate_default=True)

    scheduler: str = Field(default="Perseus", description="Scheduler name or module:Class.")
    scheduler_args: dict[str, Any] = Field(default_factory=dict)
    log_level: str = "info"
    dump_data: bool = False
    dump_dir: str = "./dump"
    max_job_idle_time: int = Field(default=60 * 60 * 24 * 7, gt=0)
    dump_keep_rounds: int = Field(default=10, ge=0, le=1_000_000)

    @field_validator("scheduler")
    @classmethod
    def _strip_scheduler(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("scheduler must name a scheduler, e.g. 'Perseus'")
        return value

    @field_validator("log_level")
    @classmethod
    def _check_log_level(cls, value: str) -> str:
        valid = ("critical", "error", "warning", "info", "debug", "trace")
        if value.lower() not in valid:
            raise ValueError(f"log_level {value!r} is not one of {', '.join(valid)}")
        return value.lower()

    @property
    def scheduler_name(self) -> str:
        """The scheduler's class name (a plugin's ``Class`` part)."""
        return self.scheduler.rpartition(":")[2]
