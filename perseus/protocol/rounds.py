"""One scheduling round on the wire: the `FrequencySchedule` a rank gets (with the job's
`RoundStatus`) and the `ProfilingResult` it reports (with its `EnergyWindow`s and, from a
leader, one `ReplicaFigures` per replica)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from perseus.domain.schedule import MAX_ACTIONS
from perseus.protocol.limits import (
    AFTER_WORK_EDGES_S,
    MAX_ITERATIONS,
    MAX_POWER_W,
    MAX_REPLICAS,
    MAX_TIME_S,
    MAX_WINDOWS,
    InstructionKind,
    Joules,
    Seconds,
    Span,
)

__all__ = [
    "MAX_NOTES",
    "EnergyWindow",
    "FrequencySchedule",
    "JobNote",
    "JobOutcome",
    "ProfilingResult",
    "ReplicaFigures",
    "RoundStatus",
]


MAX_NOTES = 32
"""Notes one round's status may carry."""
MAX_NOTE_CHARS = 2000


class JobNote(BaseModel):
    """One line the coordinator asks the job to log (rank 0 logs it)."""

    level: Literal["info", "warning"] = "info"
    text: str = Field(max_length=MAX_NOTE_CHARS)


class RoundStatus(BaseModel):
    """Where the job stands, sent to rank 0 with its schedule so the job can say what it
    does without the user configuring anything (`perseus.client.hook`)."""

    phase: str = Field(max_length=64, description="e.g. profiling, deployed, all-max")
    round: int = Field(ge=0)
    profiling_rounds: int | None = Field(
        default=None, ge=0, description="about how many rounds profiling takes in all"
    )
    notes: list[JobNote] = Field(default_factory=list, max_length=MAX_NOTES)
    summary: str | None = Field(
        default=None,
        max_length=MAX_NOTE_CHARS,
        description="the job's measured figures so far, one line (logged when the job ends)",
    )


class JobOutcome(BaseModel):
    """What a job did, as the coordinator answers ``POST /finish`` (rank 0 logs it): rounds,
    measured iterations and joules (every GPU), and the energy report's savings (None until
    both sides are known)."""

    job_id: str = Field(max_length=512)
    rounds: int = Field(ge=0, description="rounds handed out")
    iterations_measured: int = Field(
        ge=0, description="iterations of the rounds every rank reported"
    )
    energy_j: float = Field(ge=0.0, description="energy every GPU measured over them, J")
    measured_saving: float | None = None
    measured_slowdown: float | None = None
    predicted_saving: float | None = None
    predicted_slowdown: float | None = None


class FrequencySchedule(BaseModel):
    """Frequency schedule for one iteration of one rank.

    `frequencies` is a list of (instruction name, frequency in MHz), in execution order.
    `steps`: run it for at least this many iterations before reporting (the hook runs
    ``max(steps_per_round, steps)``); None: the hook's own `steps_per_round`. The
    coordinator asks for long rounds while it profiles, so that the energy counter
    refreshes often enough within each.
    `status` (the first talking rank's schedule only, rank 0's in practice; optional, Zeus's
    clients ignore it): where the job stands and what to log.

    Protocol 2, a leader's schedule: `frequencies` is what its group runs, except the
    data-parallel replicas listed in `replica_frequencies` (replica → its own list: a
    straggler's pipeline keeps a plan the others leave); `frequencies_for` picks a replica's.
    """

    rank: int = Field(ge=0)
    frequencies: list[tuple[str, int]]
    steps: int | None = Field(default=None, ge=1, le=MAX_ITERATIONS)
    status: RoundStatus | None = None
    replica_frequencies: dict[Annotated[int, Field(ge=0)], list[tuple[str, int]]] = Field(
        default_factory=dict, max_length=MAX_REPLICAS
    )

    def frequencies_for(self, dp_rank: int) -> list[tuple[str, int]]:
        """The list data-parallel replica `dp_rank` runs."""
        return self.replica_frequencies.get(dp_rank, self.frequencies)

    def lists(self) -> list[list[tuple[str, int]]]:
        """Every list this schedule hands out (`frequencies`, then each replica's own)."""
        return [self.frequencies, *self.replica_frequencies.values()]


class ReplicaFigures(BaseModel):
    """Protocol 2: one data-parallel replica of a leader's stage, measured in-job over the
    round (`ProfilingResult.replicas`): what straggler detection needs of each pipeline.

    Attributes:
        dp_rank: The replica.
        iter_time_s: Mean iteration time of its slowest tensor rank, s.
        busy_s: Per iteration, the instruction time of its busiest tensor rank, s.
        energy_j: Mean iteration energy of all its tensor ranks, J.
    """

    model_config = ConfigDict(extra="forbid")

    dp_rank: int = Field(ge=0)
    iter_time_s: Seconds
    busy_s: Annotated[float, Field(ge=0.0, le=MAX_TIME_S, allow_inf_nan=False)]
    energy_j: Joules


class EnergyWindow(BaseModel):
    """The energy a GPU's counter showed between two of its refreshes, and what ran meanwhile.

    Attributes:
        energy_j: The counter's difference between the two refreshes (exact up to the
            sensor's noise: both ends are refreshes).
        time_s: Seconds between them.
        busy_s: Per instruction of the rank's iteration order (its index), the seconds it
            ran inside the window, summed over the iterations there; the rest is idle.
        tail_s: Seconds of the window within the last `SAMPLED_TAIL` of each refresh period.
        tail_busy_s: Per instruction, its seconds within those tails.
        after_s: Per band after work stopped (`AFTER_WORK_EDGES_S`: the first 4 ms, up
            to 16 ms, up to 64 ms), per instruction (as `busy_s`), the window's idle seconds
            in that band after an instruction ended, before the next began; empty from
            older clients.
        tail_after_s: The same within the periods' tails.
    """

    model_config = ConfigDict(extra="forbid")

    energy_j: Joules
    time_s: Seconds
    busy_s: list[Span] = Field(max_length=MAX_ACTIONS)
    tail_s: Span = 0.0
    tail_busy_s: list[Span] = Field(default_factory=list, max_length=MAX_ACTIONS)
    after_s: list[Annotated[list[Span], Field(max_length=MAX_ACTIONS)]] = Field(
        default_factory=list, max_length=len(AFTER_WORK_EDGES_S)
    )
    tail_after_s: list[Annotated[list[Span], Field(max_length=MAX_ACTIONS)]] = Field(
        default_factory=list, max_length=len(AFTER_WORK_EDGES_S)
    )

    @model_validator(mode="after")
    def _check_parts(self) -> EnergyWindow:
        slack = 1e-6 * self.time_s + 1e-9
        if sum(self.busy_s) > self.time_s + slack:
            raise ValueError(
                f"busy_s adds up to {sum(self.busy_s)!r} s, more than the window's "
                f"{self.time_s!r} s"
            )
        if self.tail_s > self.time_s + slack or sum(self.tail_busy_s) > self.tail_s + slack:
            raise ValueError("tail_s and tail_busy_s must fit in the window and its tails")
        if self.tail_busy_s and len(self.tail_busy_s) != len(self.busy_s):
            raise ValueError("tail_busy_s needs one entry per entry of busy_s")
        for name, bands, parts, span in (
            ("after_s", self.after_s, self.busy_s, self.time_s),
            ("tail_after_s", self.tail_after_s, self.tail_busy_s, self.tail_s),
        ):
            if any(len(band) != len(self.busy_s) for band in bands):
                raise ValueError(f"each band of {name} needs one entry per entry of busy_s")
            if sum(parts) + sum(sum(band) for band in bands) > span + slack:
                raise ValueError(f"{name} and the busy seconds together must fit in the window")
        return self


class ProfilingResult(BaseModel):
    """Profiling results for a `FrequencySchedule` of a rank.

    Every time is finite and > 0 (at most `MAX_TIME_S`), every energy finite and >= 0 (at
    most `MAX_ENERGY_J`): a bad number is refused here (422 naming the field), before it
    reaches the job or its scheduler. The coordinator also checks the breakdowns' shapes
    against the job's schedule (`FrequencyScheduler.check_result`).

    Attributes:
        rank: Global rank of the reporting client.
        iter_time: Latency of all iterations within the profiling window, in seconds.
        iter_energy: Energy of all iterations within the profiling window, in Joules
            (one per entry of `iter_time`).
        time_breakdown: Duration of each operation across iterations, e.g.
            ``{"forward": [[0.1, 0.12], [0.1, 0.11]]}`` (iteration × occurrence).
        energy_breakdown: Energy of each operation, same structure as `time_breakdown`.
            On a GPU whose counter refreshes (every real one), each instruction's share of
            its iteration's energy by time: an instruction's own energy cannot be read.
        energy_windows: The round cut at the energy counter's refreshes (`EnergyWindow`),
            from which the coordinator estimates each instruction's energy; None when the
            rank has no energy counter (or an older client). A leader sends its own GPU's.
        replicas: Protocol 2 (a leader's result): one entry per replica it speaks for.
        idle_power_w: Protocol 2: the median, over the GPUs of the leader's group that
            were ever idle, of the power each drew while not computing, W (None: none was).
        idle_before_s: Per instruction of the rank's iteration order (its index), the mean
            over the round of the seconds its GPU was idle before it started (since the
            instruction before it ended: bubbles, waits for a peer, the optimizer step), so
            that the coordinator counts a clock change's landing in wall time; None from
            older clients. A leader sends its own GPU's.

    A leader's result speaks for its whole group (`perseus.client.wire.leaders`, gathered
    in-job): `iter_time` is each iteration's slowest GPU of the group, `iter_energy` each
    iteration's sum over the group's GPUs, `time_breakdown` each instruction's slowest GPU,
    and `energy_breakdown` each instruction's sum over the tensor ranks of the leader's own
    replica (one pipeline's energy, as the profile counts it).
    """

    rank: int = Field(ge=0)
    iter_time: list[Seconds] = Field(min_length=1, max_length=MAX_ITERATIONS)
    iter_energy: list[Joules] = Field(min_length=1, max_length=MAX_ITERATIONS)
    time_breakdown: dict[
        InstructionKind,
        Annotated[
            list[Annotated[list[Seconds], Field(max_length=MAX_ACTIONS)]],
            Field(max_length=MAX_ITERATIONS),
        ],
    ] = Field(default_factory=dict)
    energy_breakdown: dict[
        InstructionKind,
        Annotated[
            list[Annotated[list[Joules], Field(max_length=MAX_ACTIONS)]],
            Field(max_length=MAX_ITERATIONS),
        ],
    ] = Field(default_factory=dict)
    energy_windows: list[EnergyWindow] | None = Field(default=None, max_length=MAX_WINDOWS)
    replicas: list[ReplicaFigures] = Field(default_factory=list, max_length=MAX_REPLICAS)
    idle_power_w: float | None = Field(default=None, ge=0.0, le=MAX_POWER_W, allow_inf_nan=False)
    idle_before_s: list[Span] | None = Field(default=None, max_length=MAX_ACTIONS)

    @model_validator(mode="after")
    def _check_shapes(self) -> ProfilingResult:
        iters = len(self.iter_time)
        if len(self.iter_energy) != iters:
            raise ValueError(
                f"iter_energy has {len(self.iter_energy)} entries but iter_time has {iters}; "
                "report one time and one energy per iteration"
            )
        for kind in sorted(set(self.time_breakdown) | set(self.energy_breakdown)):
            times = self.time_breakdown.get(kind, [])
            energies = self.energy_breakdown.get(kind, [])
            shape_t, shape_e = [len(x) for x in times], [len(x) for x in energies]
            if shape_t != shape_e:
                raise ValueError(
                    f"time_breakdown[{kind!r}] and energy_breakdown[{kind!r}] differ in shape "
                    f"(entries per iteration {shape_t} vs {shape_e}); report one energy per "
                    "duration"
                )
            if any(shape_t) and len(times) != iters:
                raise ValueError(
                    f"time_breakdown[{kind!r}] has {len(times)} iteration(s) but iter_time has "
                    f"{iters}; report one list per iteration"
                )
        return self
