"""Scheduler arguments (``PERSEUS_SCHEDULER_ARGS``), declared once as validated models.

Each scheduler class names its model in ``Args``; `perseus.schedulers.base.check_scheduler_args`
validates a JSON object against it (at coordinator start for the defaults, and when a
job's scheduler is built) and the constructor receives the validated instance. Shared
groups are declared here once:

- `PipelineArgs`: the pipeline every pipeline scheduler runs (`num_microbatches` is
  required, `schedule`).
- `SweepArgs`: the online instruction sweep (`perseus.schedulers.sweep.instruction_sweep`).
- `ProfileSourceArgs`: a given profile / blocking power instead of measuring them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from perseus.domain.kinds import MAX_PLAUSIBLE_POWER_W, MIN_PLAUSIBLE_POWER_W, SCHEDULES
from perseus.domain.schedule import schedule_name
from perseus.domain.units import blocking_power_problem
from perseus.errors import ScheduleError

__all__ = ["PipelineArgs", "ProfileSourceArgs", "SchedulerArgs", "SweepArgs"]


class SchedulerArgs(BaseModel):
    """Base of every scheduler's arguments (none); unknown names are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class PipelineArgs(SchedulerArgs):
    """The pipeline a job runs when the job does not describe it at registration
    (`perseus.protocol.PipelineSpec`): defaults for clients that send none."""

    num_microbatches: int | None = Field(
        default=None,
        ge=1,
        description=(
            "the microbatches per iteration of jobs that do not describe their pipeline: "
            "e.g. PERSEUS_SCHEDULER_ARGS='{\"num_microbatches\": 8}' (None: every job "
            "must describe its pipeline)"
        ),
    )
    schedule: str = Field(
        default="1f1b", description=f"the pipeline schedule: {' | '.join(SCHEDULES)}"
    )
    num_chunks: int = Field(
        default=2, ge=1, description="stages per rank of the interleaved schedule"
    )

    @field_validator("schedule")
    @classmethod
    def _known_schedule(cls, value: str) -> str:
        try:
            return schedule_name(value)
        except ScheduleError as exc:
            raise ValueError(str(exc)) from None


class SweepArgs(SchedulerArgs):
    """The online frequency sweep (`perseus.schedulers.sweep.instruction_sweep.InstructionSweep`)."""

    warmup_rounds: int = Field(default=1, ge=0, description="all-max rounds before measuring")
    freq_step: int = Field(default=1, ge=1, description="profile every freq_step-th frequency")
    min_frequency: int | None = Field(
        default=None, gt=0, description="lowest frequency to profile, MHz (None: the lowest)"
    )
    early_stop_after: int = Field(
        default=2, ge=1, description="consecutive metric rises that stop a group's sweep"
    )
    sweep: Literal["coarse", "full"] = Field(
        default="coarse",
        description="'coarse': every coarse_step-th level first, each instruction stopped once "
        "its energy is stop_margin above its minimum for early_stop_after levels, then (with "
        "refine) the skipped levels next to its fastest and cheapest options and the bends of "
        "its time-energy hull, by bisection; 'full': every level, each instruction stopped "
        "after early_stop_after energy rises in a row",
    )
    coarse_step: int = Field(
        default=4,
        ge=1,
        description="the coarse pass measures every coarse_step-th supported clock (every "
        "level when freq_step is as coarse)",
    )
    stop_margin: float = Field(
        default=0.03,
        ge=0.0,
        le=1.0,
        description="coarse pass: relative energy above the instruction's minimum so far that "
        "counts as past its energy-optimal clock (above measurement noise)",
    )
    refine: bool = Field(
        default=True, description="coarse sweep: measure skipped levels where they matter"
    )
    refine_tolerance: float = Field(
        default=0.0005,
        ge=0.0,
        le=1.0,
        description="coarse sweep: the relative energy a skipped level may save below the line "
        "between its measured neighbours before it is worth measuring",
    )
    estimator: Literal["windows", "breakdown"] = Field(
        default="windows",
        description="'windows': every (stage, kind, clock)'s energy is fitted by least squares "
        "to the energy counter's refreshes the ranks report (perseus.schedulers.sweep.power_fit), each "
        "with its standard error, and rounds are long enough to hold round_ticks refreshes; "
        "'breakdown': each instruction's energy as the ranks report it (exact only where a "
        "GPU shows per-instruction energy, which no real one does; used anyway for ranks "
        "that report no windows)",
    )
    round_ticks: int = Field(
        default=10,
        ge=1,
        le=1000,
        description="'windows': energy-counter refreshes each profiling round holds at least "
        "(10 at the 100 ms of an H100: about 1.2 s), from the refresh period the ranks "
        "measured and the last measured iteration time",
    )
    target_uncertainty: float = Field(
        default=0.01,
        ge=0.0,
        le=1.0,
        description="'windows': an option whose energy's standard error is above this share "
        "of it, and that could change the plan (not clearly dominated), is measured again "
        "(0: never)",
    )
    max_repeats: int = Field(
        default=2,
        ge=0,
        le=10,
        description="'windows': most extra measurements of one option (their rounds are "
        "also capped at half the rounds before them)",
    )


class ProfileSourceArgs(SweepArgs):
    """What a planning scheduler is given instead of measuring it (None: measure it)."""

    p2p_power: float | None = Field(
        default=None, ge=0.0, description="the GPUs' blocking power, W (None: measured)"
    )
    profile_path: str | None = Field(
        default=None, description="a profile CSV to plan from (None: sweep online)"
    )
    allow_implausible_power: bool = Field(
        default=False,
        description="accept profile_path rows whose power (energy / time) is outside 1 W..2 kW "
        "(by default refused as a unit mistake: times in ms, energies in mJ)",
    )

    @field_validator("p2p_power")
    @classmethod
    def _plausible_blocking_power(cls, value: float | None) -> float | None:
        if value is None:
            return None
        problem = blocking_power_problem(
            value, MIN_PLAUSIBLE_POWER_W, MAX_PLAUSIBLE_POWER_W, gpu="a GPU", name="p2p_power"
        )
        if problem:
            raise ValueError(problem)
        return value
