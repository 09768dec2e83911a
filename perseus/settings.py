"""The coordinator's settings (``PERSEUS_*`` environment variables), as in Zeus's seed API."""

from __future__ import annotations

from typing import Any

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from zeus_power.bearer import check_bearer_token

__all__ = ["PerseusSettings"]


class PerseusSettings(BaseSettings):
    """Perseus settings, configurable via environment variables with the ``PERSEUS_`` prefix.

    The scheduler stays a name here: the coordinator resolves it (and checks
    `scheduler_args` against it) when it starts, through `perseus.schedulers.registry`, so that
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
        token: The shared secret every request but ``GET /healthz`` must present as
            ``Authorization: Bearer <token>`` (``PERSEUS_TOKEN``; at least 16 characters).
            None: no authentication (only allowed on loopback by ``perseus serve``).
        max_body_bytes: Request bodies larger than this are refused with 413, unread.
        max_world_size: Jobs with a larger ``world_size`` are refused with 422.
        max_jobs: Live jobs at most; registering one more answers 503 until one ends.
        header_timeout_s: Seconds a connection may take to send its request headers
            before it is closed (``perseus serve``).
        dump_keep_rounds: With `dump_data`, how many rounds' schedules and results
            (``N.sched.json``, ``N.prof.json``) each job keeps; older ones are deleted as
            new rounds are written (``PERSEUS_DUMP_KEEP_ROUNDS``; 0 keeps every round),
            except the job's last `dump_keep_rounds` all-max and deployed rounds, which its
            energy report (``perseus report``) is made from.
        metrics_token: A read-only credential for ``GET /metrics`` alone
            (``PERSEUS_METRICS_TOKEN``; at least 16 characters, not the cluster token):
            a Prometheus scrape config holds it instead of the token that drives every
            GPU clock. None: ``/metrics`` needs the cluster token (when there is one).
        ended_job_ttl_s: Seconds a finished or failed job stays listed (``/jobs``, its
            ``/metrics`` series) after it ends; then it is forgotten (its dump stays).
        solve_workers: Frontier solves that run at once, each in a process of its own,
            for all the coordinator's jobs together (`perseus.schedulers.perseus_scheduler.solve_pool`); more wait
            their turn, their jobs at all-max meanwhile. Each needs ~100 KB of memory per
            instruction of its pipeline (0.8 GB at 16 stages × 256 microbatches).
        solve_timeout_s: Seconds a frontier solve may run; one that runs longer is stopped
            and its job holds all-max, saying why.
        solve_memory_mb: Memory a solve's process may add, MiB (its address-space limit);
            a frontier estimated to need more is not solved (the job holds all-max, saying
            why). None: the machine's available memory is the only bound.
    """

    model_config = SettingsConfigDict(
        env_prefix="PERSEUS_", extra="forbid", validate_default=True, hide_input_in_errors=True
    )

    scheduler: str = Field(default="Perseus", description="Scheduler name or module:Class.")
    scheduler_args: dict[str, Any] = Field(default_factory=dict)
    log_level: str = "info"
    dump_data: bool = False
    dump_dir: str = "./dump"
    max_job_idle_time: int = Field(default=60 * 60 * 24 * 7, gt=0)
    token: SecretStr | None = Field(default=None, repr=False)
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    max_world_size: int = Field(default=65_536, ge=1)
    max_jobs: int = Field(default=1024, ge=1)
    header_timeout_s: float = Field(default=10.0, gt=0, allow_inf_nan=False)

    @field_validator("token", mode="before")
    @classmethod
    def _check_token(cls, value: object) -> object:
        return check_bearer_token(value)

    dump_keep_rounds: int = Field(default=10, ge=0, le=1_000_000)
    metrics_token: SecretStr | None = Field(default=None, repr=False)
    ended_job_ttl_s: float = Field(default=600.0, ge=0.0, le=7 * 24 * 3600.0, allow_inf_nan=False)
    solve_workers: int = Field(default=2, ge=1, le=256)
    solve_timeout_s: float = Field(default=1800.0, gt=0.0, le=7 * 24 * 3600.0, allow_inf_nan=False)
    solve_memory_mb: int | None = Field(default=None, ge=1, le=2**30)

    @field_validator("metrics_token", mode="before")
    @classmethod
    def _check_metrics_token(cls, value: object) -> object:
        return check_bearer_token(value)

    @model_validator(mode="after")
    def _metrics_token_is_not_the_cluster_token(self) -> PerseusSettings:
        if (
            self.metrics_token is not None
            and self.token is not None
            and self.metrics_token.get_secret_value() == self.token.get_secret_value()
        ):
            raise ValueError(
                "the metrics token must differ from the cluster token (PERSEUS_TOKEN): it is "
                "meant for a scrape config, which must not hold the keys to every GPU clock"
            )
        return self

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
    def token_value(self) -> str | None:
        """The token in clear (for the auth middleware only; never log it)."""
        return self.token.get_secret_value() if self.token is not None else None

    @property
    def metrics_token_value(self) -> str | None:
        """The metrics token in clear (for the auth middleware only; never log it)."""
        return self.metrics_token.get_secret_value() if self.metrics_token is not None else None

    @property
    def scheduler_name(self) -> str:
        """The scheduler's class name (a plugin's ``Class`` part)."""
        return self.scheduler.rpartition(":")[2]
