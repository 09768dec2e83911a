"""The scheduler interface the coordinator drives.

One instance per job. The coordinator talks to it through these methods, and no other:

- A round (Zeus's two): `observe(results)` with the previous round's results, then
  `next_schedule()`, once every talking rank has asked for its next schedule.
- `report()`: what goes with the round's schedules (`RoundReport`): the job's status for rank
  0's log, the plan's events since the last report (deployments, checks, moves: the operator's
  view), the deployed plan (persisted as ``deployed_plan.json`` when `dump_data` is on) and
  the all-max plan scored like it (the energy report's baseline). Default: nothing to report.
- `check_result(result)`: a rank's result on arrival, before it is kept: raise `RankError`
  when it cannot be this job's (the default refuses only a result without breakdowns when
  `needs_breakdowns` says why they are needed); a refused result is a 422 for that rank,
  which may send a corrected one.
- `on_straggler(dp_rank, slowdown)`: a data-parallel pipeline was announced slow
  (``POST /straggler/{job_id}``); the default refuses (a 400).
- `resume(plan)`: a restarted coordinator found the job's ``deployed_plan.json``; the
  scheduler goes straight back to running that plan (default: ignore it).
- `close()`: the job ended, failed or was evicted, or the coordinator shuts down: stop
  what works for it in the background (a frontier solve's process); default nothing.

And once per job, at registration, the class method `check_job` (default: any job).

Per-instruction breakdowns (`ProfilingResult.time_breakdown` / ``energy_breakdown``) are
optional on the wire: Zeus's clients send none by default. A scheduler that cannot work
without them declares why in `needs_breakdowns`; one that leaves it None takes results
with only the iteration's time and energy (`has_breakdowns`).

Scheduler arguments (``PERSEUS_SCHEDULER_ARGS``) are a pydantic model the class names in
``Args`` (`perseus.schedulers.args`: shared groups declared once). `check_scheduler_args`
validates a JSON object against it, once at coordinator start and once per job in
`build_scheduler`, which hands the validated model to the constructor as its fourth
argument; constructors do not check their arguments again.
"""

from __future__ import annotations

import abc
import inspect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import ValidationError

from perseus.errors import ConfigurationError, RankError
from perseus.protocol import FrequencySchedule, JobInfo, ProfilingResult, RankInfo, RoundStatus
from perseus.schedulers.args import SchedulerArgs
from perseus.settings import PerseusSettings

if TYPE_CHECKING:
    from perseus.domain.plan import Plan

__all__ = [
    "FrequencyScheduler",
    "RoundReport",
    "build_scheduler",
    "check_scheduler_args",
    "has_breakdowns",
]


def has_breakdowns(result: ProfilingResult) -> bool:
    """Whether `result` reports any per-instruction time or energy (Zeus's default
    `ProfilingResult` has empty breakdowns)."""
    return any(result.time_breakdown.values()) or any(result.energy_breakdown.values())


@dataclass(frozen=True)
class RoundReport:
    """What a scheduler tells the coordinator with a round's schedules
    (`FrequencyScheduler.report`)."""

    status: RoundStatus | None = None
    """Where the job stands and what it should log, sent to rank 0 (None: nothing to say)."""
    events: list[dict[str, Any]] = field(default_factory=list)
    """The plan's deployments, checks and moves since the last report, each a JSON object
    with at least ``round``, ``event`` and ``reason``."""
    plan: Plan | None = None
    """The plan chosen for the job, if the scheduler deploys one (persisted on dumps)."""
    baseline: Plan | None = None
    """The all-max plan scored like `plan` (the energy report's predicted baseline)."""


class FrequencyScheduler(abc.ABC):
    """Base class of frequency schedulers."""

    Args: ClassVar[type[SchedulerArgs]] = SchedulerArgs
    """The model of this scheduler's arguments (`perseus.schedulers.args`); default: none."""

    needs_breakdowns: ClassVar[str | None] = None
    """Why this scheduler needs every result's per-instruction breakdowns, said to the
    client whose result has none (a 422); None: results without them are accepted."""

    def __init__(
        self,
        job_info: JobInfo,
        rank_infos: list[RankInfo],
        perseus_settings: PerseusSettings,
        args: SchedulerArgs,
    ) -> None:
        self.job_info = job_info
        self.rank_infos = sorted(rank_infos, key=lambda r: r.rank)
        self.settings = perseus_settings
        self.args = args
        """The validated scheduler arguments (an instance of ``type(self).Args``)."""

    @abc.abstractmethod
    def next_schedule(self) -> list[FrequencySchedule]:
        """The next round's schedule for every rank of the job (one per rank)."""

    @abc.abstractmethod
    def observe(self, profiling_results: list[ProfilingResult]) -> None:
        """Ingest the results of the last round (one per rank)."""

    # ------------------------------------------------------------------ optional hooks
    @classmethod
    def check_job(cls, job_info: JobInfo, args: SchedulerArgs) -> None:
        """Refuse, at registration, a job this scheduler cannot serve with `args`
        (`ConfigurationError`); default: any job."""
        return None

    def report(self) -> RoundReport:
        """What goes with the schedules `next_schedule` just returned (`RoundReport`);
        default: nothing."""
        return RoundReport()

    def close(self) -> None:  # noqa: B027 - a hook whose default is to do nothing
        """The job is over for the coordinator (it ended, failed or was evicted, or the
        coordinator shuts down): stop its background work. Called on the event loop, maybe
        while a round of the job is being computed on a worker thread: it must return at
        once and not wait for that work (default: nothing to stop)."""

    def resume(self, plan: Plan) -> None:  # noqa: B027 - a hook whose default is to do nothing
        """Go back to running `plan`, persisted before a coordinator restart (default: ignore)."""

    def check_result(self, result: ProfilingResult) -> None:
        """Refuse (`RankError`) a result that cannot be this job's, e.g. breakdowns whose
        shapes do not match the rank's instructions. Called on the event loop: keep it
        cheap and free of side effects. The default refuses a result without breakdowns
        when the scheduler `needs_breakdowns`, and accepts every other."""
        if self.needs_breakdowns is not None and not has_breakdowns(result):
            raise RankError(
                f"Rank {result.rank} reported no per-instruction time_breakdown and "
                f"energy_breakdown, but scheduler {type(self).__name__} needs them: "
                f"{self.needs_breakdowns}. Report one time and energy per executed "
                "instruction, per iteration (Perseus's client does), or run a scheduler that "
                "needs none (AllMaxFrequency, PointSolution)"
            )

    def on_straggler(self, dp_rank: int, slowdown: float) -> None:
        """Data-parallel pipeline `dp_rank` runs `slowdown`× its normal time (1.0: recovered).

        The default refuses: this scheduler does not handle straggler announcements.
        """
        raise ConfigurationError(
            f"Scheduler {type(self).__name__} does not handle straggler announcements "
            "(use PERSEUS_SCHEDULER=Perseus)"
        )


def check_scheduler_args(cls: type, args: dict[str, Any]) -> SchedulerArgs:
    """Validate scheduler arguments against ``cls.Args``; return the validated model.

    Raises `ConfigurationError` naming every bad argument and listing the accepted ones.
    """
    if not (inspect.isclass(cls) and issubclass(cls, FrequencyScheduler)):
        raise ConfigurationError(
            f"Scheduler {getattr(cls, '__name__', cls)!r} does not subclass "
            "perseus.schedulers.base.FrequencyScheduler"
        )
    model = cls.Args
    try:
        return model.model_validate(args)
    except ValidationError as exc:
        problems = "; ".join(_problem(cls, model, e) for e in exc.errors())
        accepted = ", ".join(model.model_fields) or "no arguments"
        raise ConfigurationError(
            f"Invalid scheduler_args for {cls.__name__}: {problems}. It accepts: {accepted}."
        ) from None


def _problem(cls: type, model: type[SchedulerArgs], error: Any) -> str:
    loc = ".".join(str(x) for x in error["loc"]) or "<args>"
    if error["type"] != "missing":
        return f"{loc}: {error['msg']} (got {error['input']!r})"
    field = model.model_fields.get(loc)
    why = f": {field.description}" if field is not None and field.description else ""
    return f"{loc}: {error['msg']} ({cls.__name__} needs {loc}{why})"


def build_scheduler(
    cls: type,
    job_info: JobInfo,
    rank_infos: list[RankInfo],
    perseus_settings: PerseusSettings,
    args: dict[str, Any],
) -> FrequencyScheduler:
    """Validate `args` and construct one scheduler instance for a job."""
    checked = check_scheduler_args(cls, args)
    return cls(job_info, rank_infos, perseus_settings, checked)  # type: ignore[no-any-return]
