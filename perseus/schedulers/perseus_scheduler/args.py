"""`Perseus`'s arguments (``PERSEUS_SCHEDULER_ARGS``): planning, the choice of a frontier
point, the guard that checks its promise, and stragglers."""

from __future__ import annotations

from pydantic import Field, field_validator

from perseus.domain.units import max_slowdown_problem
from perseus.schedulers.perseus_scheduler.drift import DEFAULT_REPROFILE_DRIFT
from perseus.schedulers.planning import PlanningArgs

__all__ = ["PerseusArgs"]


class PerseusArgs(PlanningArgs):
    """`Perseus`'s arguments: planning, the choice of a frontier point, its guard, stragglers."""

    max_slowdown: float = Field(
        default=0.0, ge=0.0, description="allowed slowdown vs all-max, a fraction (0.05 = 5 %)"
    )
    deadline: float | None = Field(
        default=None, gt=0.0, description="iteration time bound, s (overrides max_slowdown)"
    )
    straggler_threshold: float = Field(
        default=0.05, gt=0.0, description="relative slowness that marks a straggler"
    )
    straggler_rounds: int = Field(
        default=2, ge=1, description="rounds in a row to detect a straggler or its recovery"
    )
    switch_latency_ms: float | None = Field(
        default=None,
        ge=0.0,
        le=10_000.0,
        description="override: the time a clock change takes to apply, ms (default: the "
        "slowest one the job's ranks measured on their GPUs)",
    )
    hop_latency_ms: float | None = Field(
        default=None,
        ge=0.0,
        le=10_000.0,
        description="override: time added to every P2P hop between pipeline ranks, ms "
        "(default: calibrated from the job's all-max rounds)",
    )
    solve_on_thread_above: int = Field(
        default=2048,
        ge=0,
        le=10_000_000,
        description="pipelines of more instructions than this are solved in a process of their "
        "own (PERSEUS_SOLVE_WORKERS at once) while all-max rounds go on, so that no rank waits "
        "on a solve of minutes (16 stages × 256 microbatches); 0: always",
    )
    baseline_rounds: int = Field(
        default=4,
        ge=0,
        le=1000,
        description="all-max rounds measured before profiling: the reference of every measured "
        "saving and slowdown (0: none, and no guard)",
    )
    guard: bool = Field(
        default=True,
        description="compare the deployed plan's measured rounds with the all-max ones and "
        "move to a faster plan or back to all-max when it breaks its budget or saves nothing "
        "(off: also no check that the predicted saving stands out of the all-max rounds' spread)",
    )
    guard_window: int = Field(
        default=4, ge=2, le=1000, description="deployed rounds per guard check"
    )
    reference_every: int = Field(
        default=10,
        ge=0,
        le=10_000,
        description="while a plan runs, every reference_every-th round runs all-max, so the "
        "guard compares the plan with all-max measured at the same time (machines drift: "
        "temperature, other jobs); it costs that share of the saving. 0: only the all-max "
        "rounds before profiling",
    )
    reprofile_drift: float = Field(
        default=DEFAULT_REPROFILE_DRIFT,
        ge=0.0,
        le=1.0,
        description="while a plan runs, profile the job again when the all-max reference "
        "rounds' median iteration time or energy drifts by more than this fraction from the "
        "all-max rounds the profile was taken with (the GPUs no longer match it; "
        "perseus.schedulers.perseus_scheduler.drift); 0: never",
    )
    guard_z: float = Field(
        default=3.0,
        gt=0.0,
        le=10.0,
        description="standard errors (of the all-max rounds' spread) that make a measured "
        "difference real",
    )

    @field_validator("max_slowdown")
    @classmethod
    def _slowdown_is_a_fraction(cls, value: float) -> float:
        problem = max_slowdown_problem(value)
        if problem:
            raise ValueError(problem)
        return value
