"""The scheduler interface the coordinator drives.

One instance per job. The coordinator calls `next_schedule()` when every rank of the job
has asked for its next schedule (a round), and `observe()` with the round's results.

Optional hooks, declared here with defaults and overridden by the schedulers that use them:

- `deployed_plan()`: the plan the scheduler has chosen for the job (default None); the
  coordinator persists it as ``deployed_plan.json`` when `dump_data` is on.
- `resume(plan)`: a restarted coordinator found the job's ``deployed_plan.json``; the
  scheduler goes straight back to running that plan (default: ignore it).
- `on_straggler(dp_rank, slowdown)`: a data-parallel pipeline was announced slow
  (``POST /straggler/{job_id}``); the default refuses (a 400).

Scheduler arguments (``PERSEUS_SCHEDULER_ARGS``) are the constructor's keyword parameters
after the first three; `check_scheduler_args` validates them against the parameters' type
annotations (pydantic, so ``Annotated[int, Field(ge=1)]`` constraints apply) and
`build_scheduler` validates, then constructs. A scheduler class may add a classmethod
``validate_args(args: dict) -> None`` raising `ConfigurationError` for checks beyond types
(e.g. a required argument that has a default for `PerseusSettings`' sake).
"""

from __future__ import annotations

import abc
import inspect
import typing
from functools import cache
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from perseus.errors import ConfigurationError
from perseus.protocol import FrequencySchedule, JobInfo, ProfilingResult, RankInfo
from perseus.settings import PerseusSettings

if TYPE_CHECKING:
    from perseus.domain.plan import Plan

__all__ = ["FrequencyScheduler", "build_scheduler", "check_scheduler_args"]

_IMPLIED = ("self", "job_info", "rank_infos", "perseus_settings")


class FrequencyScheduler(abc.ABC):
    """Base class of frequency schedulers."""

    def __init__(
        self, job_info: JobInfo, rank_infos: list[RankInfo], perseus_settings: PerseusSettings
    ) -> None:
        self.job_info = job_info
        self.rank_infos = sorted(rank_infos, key=lambda r: r.rank)
        self.settings = perseus_settings

    @abc.abstractmethod
    def next_schedule(self) -> list[FrequencySchedule]:
        """The next round's schedule for every rank of the job (one per rank)."""

    @abc.abstractmethod
    def observe(self, profiling_results: list[ProfilingResult]) -> None:
        """Ingest the results of the last round (one per rank)."""

    # ------------------------------------------------------------------ optional hooks
    def deployed_plan(self) -> Plan | None:
        """The plan chosen for the job, if the scheduler deploys one (persisted on dumps)."""
        return None

    def resume(self, plan: Plan) -> None:  # noqa: B027 - a hook whose default is to do nothing
        """Go back to running `plan`, persisted before a coordinator restart (default: ignore)."""

    def on_straggler(self, dp_rank: int, slowdown: float) -> None:
        """Data-parallel pipeline `dp_rank` runs `slowdown`× its normal time (1.0: recovered).

        The default refuses: this scheduler does not handle straggler announcements.
        """
        raise ConfigurationError(
            f"Scheduler {type(self).__name__} does not handle straggler announcements "
            "(use PERSEUS_SCHEDULER=Perseus)"
        )


@cache
def _args_model(cls: type) -> type[BaseModel]:
    """A pydantic model of `cls`'s scheduler arguments, built from its constructor."""
    init = cls.__init__ if inspect.isclass(cls) else cls
    try:
        hints = typing.get_type_hints(init, include_extras=True)
    except Exception:  # unresolvable annotations in a plugin: validate names only
        hints = {}
    fields: dict[str, Any] = {}
    extra = "forbid"
    for name, param in inspect.signature(cls).parameters.items():
        if name in _IMPLIED:
            continue
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            extra = "allow"
            continue
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            continue
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[name] = (hints.get(name, Any), default)
    return create_model(  # type: ignore[call-overload,no-any-return]
        f"{cls.__name__}Args",
        __config__=ConfigDict(extra=extra, arbitrary_types_allowed=True),
        **fields,
    )


def check_scheduler_args(cls: type, args: dict[str, Any]) -> dict[str, Any]:
    """Validate scheduler arguments against `cls`'s constructor; return them coerced.

    Raises `ConfigurationError` naming every bad argument and listing the accepted ones.
    """
    model = _args_model(cls)
    try:
        validated = model.model_validate(args)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(x) for x in e['loc']) or '<args>'}: {e['msg']}"
            + (f" (got {e['input']!r})" if e["type"] != "missing" else "")
            for e in exc.errors()
        )
        accepted = ", ".join(model.model_fields) or "no arguments"
        raise ConfigurationError(
            f"Invalid scheduler_args for {cls.__name__}: {problems}. It accepts: {accepted}."
        ) from None
    out = {name: getattr(validated, name) for name in model.model_fields if name in args}
    out.update(validated.model_extra or {})
    extra_check = getattr(cls, "validate_args", None)
    if callable(extra_check):
        extra_check(out)
    return out


def build_scheduler(
    cls: type,
    job_info: JobInfo,
    rank_infos: list[RankInfo],
    perseus_settings: PerseusSettings,
    args: dict[str, Any],
) -> FrequencyScheduler:
    """Validate `args` and construct one scheduler instance for a job."""
    checked = check_scheduler_args(cls, args)
    scheduler = cls(job_info, rank_infos, perseus_settings, **checked)
    if not isinstance(scheduler, FrequencyScheduler):
        raise ConfigurationError(
            f"Scheduler {cls.__name__} does not subclass schedulers.base.FrequencyScheduler"
        )
    return scheduler
