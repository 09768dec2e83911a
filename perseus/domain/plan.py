"""Frequency plans: the plan-file model and the numbers a plan is scored with.

A plan assigns one profiled SM frequency to every instruction of one iteration. This module
is data only; the accounting (iteration time = longest path of the DAG, energy ``E = Σ eᵢ +
P_block · (S·T − Σ tᵢ)``) is the solver's exact scoring, reached through
`perseus.planning.evaluate` (the domain cannot import the solver).

Plan files are JSON, never code::

    {"version": 1, "schedule": "1f1b", "num_stages": S, "num_microbatches": M, "num_chunks": 1,
     "p2p_power": W, "iteration_time": T, "energy": E,
     "frequencies": [[["forward", 1410], ["forward", 1395], ["backward", 1380], ...], ...]}

with one list per pipeline rank ("stage" here), in that rank's execution order
(`FrequencySchedule.frequencies`). A plan for a schedule that is not built in (one a job
described, e.g. torch's ``ScheduleInterleavedZeroBubble``) also carries ``"orders"``: each
rank's ``[stage, kind, microbatch]`` actions, from which its DAG is rebuilt. A plan made
from measurements of emulated GPUs carries ``"emulated": true`` (absent means false, so plan
files from real GPUs are unchanged and older files read as before).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, field_validator

from perseus.domain.schedule import (
    MAX_ACTIONS,
    Instruction,
    PipelineSchedule,
    instructions_per_stage,
    make_schedule,
    schedule_name,
)
from perseus.errors import PlanError, ScheduleError

__all__ = [
    "Evaluation",
    "Plan",
    "ScheduledInstruction",
    "check_plan_shape",
    "clock_changes",
]

PLAN_FORMAT_VERSION = 1


@dataclass(frozen=True)
class Evaluation:
    """The exact accounting of one plan (see the module docstring)."""

    iteration_time_s: float
    energy_j: float
    compute_energy_j: float
    blocking_energy_j: float


def check_plan_shape(schedule: PipelineSchedule, frequencies: list[list[int]]) -> None:
    """Raise `PlanError` unless `frequencies` has one list per stage, one entry per instruction."""
    if len(frequencies) != schedule.num_stages:
        raise PlanError(
            f"The plan has {len(frequencies)} stage(s) but the schedule has {schedule.num_stages}"
        )
    for stage, (order, freqs) in enumerate(zip(schedule.orders, frequencies, strict=True)):
        if len(freqs) != len(order):
            raise PlanError(
                f"Stage {stage}: the plan has {len(freqs)} instruction(s) but the "
                f"{schedule.name} schedule with {schedule.num_microbatches} microbatch(es) has {len(order)}"
            )


def clock_changes(frequencies: list[list[int]]) -> int:
    """Clock changes per iteration over all ranks: instructions whose clock differs from the
    previous one on their rank (cyclically: a rank's first instruction follows its last of
    the iteration before)."""
    return sum(sum(map(operator.ne, f, [f[-1], *f[:-1]])) for f in frequencies if len(f) > 1)


@dataclass(frozen=True)
class ScheduledInstruction:
    """One instruction placed on the timeline: as-soon-as-possible start and finish."""

    instruction: Instruction
    freq_mhz: int
    start_s: float
    finish_s: float
    energy_j: float


class Plan(BaseModel):
    """A plan file: a frequency for every instruction, with the numbers it was scored at."""

    model_config = ConfigDict(extra="forbid")

    version: int = PLAN_FORMAT_VERSION
    schedule: str
    num_stages: int = Field(ge=1)
    num_microbatches: int = Field(ge=1)
    num_chunks: int = Field(default=1, ge=1)
    p2p_power: float = Field(ge=0)
    iteration_time: float
    energy: float
    frequencies: list[list[tuple[str, int]]]
    orders: list[list[tuple[int, str, int]]] | None = None
    emulated: bool = Field(default=False, exclude_if=lambda emulated: not emulated)
    """Made from an emulated GPU's numbers (the emulator's model, not a measurement)."""
    clock_changes: int | None = Field(default=None, ge=0)
    """SM clock changes per iteration over all ranks (`clock_changes`); None in older files."""
    switch_latency: float = Field(
        default=0.0, ge=0.0, le=10.0, exclude_if=lambda latency: latency == 0.0
    )
    """Seconds a clock change takes to apply, which `iteration_time` and `energy` account
    for (`perseus.planning.switching`); 0 (omitted): changes are free."""
    hop_latency: float = Field(
        default=0.0, ge=0.0, le=10.0, exclude_if=lambda latency: latency == 0.0
    )
    """Seconds every P2P hop between two pipeline ranks takes, which `iteration_time` and
    `energy` account for (an edge lag in the solver's DAG); 0 (omitted): hops are free."""

    @field_validator("version")
    @classmethod
    def _check_version(cls, v: int) -> int:
        if v != PLAN_FORMAT_VERSION:
            raise ValueError(
                f"plan format version {v} is not supported (this Perseus reads {PLAN_FORMAT_VERSION})"
            )
        return v

    @classmethod
    def from_frequencies(
        cls,
        schedule: PipelineSchedule,
        frequencies: list[list[int]],
        *,
        p2p_power_w: float,
        evaluation: Evaluation,
        emulated: bool = False,
        switch_latency_s: float = 0.0,
        hop_latency_s: float = 0.0,
    ) -> Plan:
        check_plan_shape(schedule, frequencies)
        plan = cls(
            schedule=schedule.name,
            num_stages=schedule.num_stages,
            num_microbatches=schedule.num_microbatches,
            num_chunks=schedule.num_chunks,
            p2p_power=p2p_power_w,
            iteration_time=evaluation.iteration_time_s,
            energy=evaluation.energy_j,
            frequencies=[],
            orders=None if schedule.builtin else schedule.actions(),
            emulated=emulated,
            clock_changes=clock_changes(frequencies),
            switch_latency=switch_latency_s,
            hop_latency=hop_latency_s,
        )
        # The schedule's own kinds and whole MHz: validating them again, entry by entry,
        # took two thirds of the time of a 16 x 256 frontier's 500 plans.
        plan.frequencies = [
            list(zip(kinds, map(int, freqs), strict=True))
            for kinds, freqs in zip(schedule.kind_table, frequencies, strict=True)
        ]
        return plan

    def pipeline_schedule(self) -> PipelineSchedule:
        """The schedule this plan is for; checks the plan's instruction names against it."""
        if self.orders is not None:
            return self._described_schedule()
        # Every schedule runs a forward and a backward of every microbatch (and chunk) on
        # every stage. Check the counts before laying the schedule out, so that a corrupt
        # num_microbatches cannot make it build a DAG of a billion nodes.
        key = schedule_name(self.schedule)
        per_stage = instructions_per_stage(key, self.num_microbatches, self.num_chunks)
        if len(self.frequencies) != self.num_stages:
            raise PlanError(
                f"The plan lists {len(self.frequencies)} stage(s) but says num_stages={self.num_stages}"
            )
        for stage, entries in enumerate(self.frequencies):
            if len(entries) != per_stage:
                raise PlanError(
                    f"Stage {stage}: the plan has {len(entries)} instruction(s) but the {key} "
                    f"schedule with {self.num_microbatches} microbatch(es) has {per_stage}"
                )
        schedule = make_schedule(
            self.schedule, self.num_stages, self.num_microbatches, num_chunks=self.num_chunks
        )
        self._check_names(schedule)
        return schedule

    def _described_schedule(self) -> PipelineSchedule:
        orders = self.orders or []
        total = sum(len(o) for o in orders)
        if total > MAX_ACTIONS:
            raise PlanError(f"The plan's orders hold {total:,} actions; at most {MAX_ACTIONS:,}")
        if len(orders) != self.num_stages or len(self.frequencies) != self.num_stages:
            raise PlanError(
                f"The plan lists {len(self.frequencies)} frequency list(s) and {len(orders)} "
                f"order(s) but says num_stages={self.num_stages}"
            )
        try:
            schedule = PipelineSchedule.from_orders(self.schedule, orders, self.num_microbatches)
        except ScheduleError as exc:
            raise PlanError(f"The plan's orders are not a valid schedule: {exc}") from None
        self._check_names(schedule)
        return schedule

    def _check_names(self, schedule: PipelineSchedule) -> None:
        check_plan_shape(schedule, self.stage_frequencies())
        for stage, (order, entries) in enumerate(
            zip(schedule.orders, self.frequencies, strict=True)
        ):
            for k, (instr, (name, _)) in enumerate(zip(order, entries, strict=True)):
                if instr.kind != name:
                    raise PlanError(
                        f"Stage {stage}, instruction #{k}: the plan says {name!r} but the "
                        f"{schedule.name} schedule runs {instr.kind!r} there"
                    )

    def stage_frequencies(self) -> list[list[int]]:
        """Just the frequencies, per stage."""
        return [[int(f) for _, f in entries] for entries in self.frequencies]
