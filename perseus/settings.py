"""The coordinator's settings (``PERSEUS_*`` environment variables), as in Zeus's seed API."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from pydantic import Field, field_serializer, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from perseus.errors import ConfigurationError

__all__ = ["PerseusSettings", "resolve_scheduler"]


def resolve_scheduler(name: str) -> type:
    """Resolve a scheduler name to its class.

    A short name (``"AllMaxFrequency"``) is looked up in the `schedulers` registry; a
    ``"package.module:Class"`` name loads a user plugin. Errors list the valid names.
    """
    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ConfigurationError(
                f"Cannot import scheduler plugin module {module_name!r} (from {name!r}): {exc}"
            ) from exc
        try:
            cls = getattr(module, attr)
        except AttributeError as exc:
            raise ConfigurationError(
                f"Module {module_name!r} has no scheduler class {attr!r}"
            ) from exc
        if not inspect.isclass(cls):
            raise ConfigurationError(f"Scheduler plugin {name!r} is not a class")
        return cls
    registry = importlib.import_module("schedulers").SCHEDULERS
    try:
        return registry[name]
    except KeyError:
        raise ConfigurationError(
            f"Unknown scheduler {name!r}. Valid names: {', '.join(sorted(registry))}; "
            "or give a plugin as 'package.module:ClassName'."
        ) from None


class PerseusSettings(BaseSettings):
    """Perseus settings, configurable via environment variables with the ``PERSEUS_`` prefix.

    For instance, ``PERSEUS_SCHEDULER=AllMaxFrequency`` resolves the class
    `schedulers.AllMaxFrequency`, and `scheduler` then holds a reference to that class.

    Attributes:
        scheduler: The scheduler class (given by name: a registry name or ``module:Class``).
        scheduler_args: Extra keyword arguments for the scheduler's constructor, as JSON in
            the environment (``PERSEUS_SCHEDULER_ARGS='{"max_slowdown": 0.02}'``); checked
            against the constructor's signature when the settings are built.
        log_level: Log level, e.g. "debug", "info".
        dump_data: Whether to dump internal state (ranks, schedules, results) to `dump_dir`.
        dump_dir: Directory to dump state in (if enabled).
        max_job_idle_time: Seconds a job may stay idle before the coordinator evicts it.
    """

    model_config = SettingsConfigDict(env_prefix="PERSEUS_", extra="forbid", validate_default=True)

    scheduler: Any = Field(default="Perseus", description="Scheduler name or module:Class.")
    scheduler_args: dict[str, Any] = Field(default_factory=dict)
    log_level: str = "info"
    dump_data: bool = False
    dump_dir: str = "./dump"
    max_job_idle_time: int = Field(default=60 * 60 * 24 * 7, gt=0)

    @field_validator("scheduler", mode="before")
    @classmethod
    def _resolve_scheduler(cls, value: Any) -> type:
        if isinstance(value, str):
            return resolve_scheduler(value.strip())
        if inspect.isclass(value):
            return value
        raise ConfigurationError(f"scheduler must be a name or a class, got {value!r}")

    @field_validator("log_level")
    @classmethod
    def _check_log_level(cls, value: str) -> str:
        valid = ("critical", "error", "warning", "info", "debug", "trace")
        if value.lower() not in valid:
            raise ValueError(f"log_level {value!r} is not one of {', '.join(valid)}")
        return value.lower()

    @model_validator(mode="after")
    def _validate_scheduler_args(self) -> PerseusSettings:
        """Check the args against the scheduler's constructor (job_info etc. are implied)."""
        signature = inspect.signature(self.scheduler)
        full_args = {
            "job_info": None,
            "rank_infos": None,
            "perseus_settings": None,
            **self.scheduler_args,
        }
        try:
            signature.bind(**full_args)
        except TypeError as exc:
            params = [
                p
                for p in signature.parameters
                if p not in ("job_info", "rank_infos", "perseus_settings")
            ]
            raise ConfigurationError(
                f"Invalid scheduler_args {self.scheduler_args!r} for {self.scheduler.__name__}: {exc}. "
                f"It accepts: {', '.join(params) or 'no arguments'}."
            ) from None
        return self

    @field_serializer("scheduler")
    def _serialize_scheduler(self, value: type) -> str:
        return value.__name__

    @property
    def scheduler_name(self) -> str:
        """The scheduler class's name."""
        return self.scheduler.__name__
