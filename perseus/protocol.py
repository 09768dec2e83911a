"""The wire protocol: models and routes shared by the coordinator and its per-rank client.

Names, fields and semantics follow Zeus's `zeus.optimizer.perseus.common`, rewritten for
pydantic v2. Wire lists use `RootModel`; files are written atomically.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import uuid
from datetime import datetime
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    RootModel,
    field_validator,
    model_validator,
)

from perseus.domain.kinds import INSTRUCTIONS
from perseus.domain.layout import Leaders, ParallelLayout
from perseus.domain.rows import ProfileRow
from perseus.domain.schedule import MAX_ACTIONS, PipelineSchedule
from perseus.errors import ConfigurationError, ProfileError, ScheduleError
from perseus.io.atomic import atomic_write_text
from perseus.io.jobdir import JobDir
from perseus.io.profile_csv import read_profile_rows, write_profile_rows

__all__ = [
    "EnergyWindow",
    "FrequencySchedule",
    "InstructionProfilingResult",
    "JobInfo",
    "JobNote",
    "JobOutcome",
    "JobRecord",
    "Leaders",
    "OfflineProfilingResult",
    "PROTOCOL_VERSION",
    "ParallelLayout",
    "PipelineSpec",
    "ProfilingResult",
    "RankInfo",
    "ReplicaFigures",
    "RoundStatus",
    "load_prof",
    "load_ranks",
    "load_sched",
    "save_prof",
    "save_ranks",
    "save_sched",
]

GET_SCHEDULE_URL = "/schedule/{job_id}"
REGISTER_JOB_URL = "/register_job"
REGISTER_RANK_URL = "/register_rank/{job_id}"
REPORT_RESULT_URL = "/result/{job_id}"
STRAGGLER_URL = "/straggler/{job_id}"
FINISH_URL = "/finish/{job_id}"
INFO_URL = "/info"

JOB_TOKEN_HEADER = "X-Perseus-Job-Token"
"""The job credential: answered by ``POST /register_job``, required by every route under
the job's id (``/register_rank``, ``/schedule``, ``/result``, ``/finish``; ``/straggler``
and ``GET /jobs/{job_id}`` take it or the coordinator's token)."""


InstructionKind = Literal["forward", "backward", "backward_input", "backward_weight"]

# Bounds of a measurement, checked where it arrives. Beyond them a number is a unit mistake
# or a broken meter, and a sum of a window's worth of them could overflow to inf (1e308
# each) or poison every mean (NaN): a measurement is finite, a time positive, an energy
# non-negative, each below a bound that keeps any sum the schedulers take finite.
MAX_TIME_S = 1e6
"""A time above 11.6 days (per iteration or per instruction) is a unit mistake."""
MAX_ENERGY_J = 1e10
"""An energy above 10 GJ (a 1 kW GPU for 116 days) is a unit mistake."""
MAX_ITERATIONS = 10_000
"""Iterations in one profiling window (one round's result)."""
MAX_FREQUENCIES = 1024
"""SM clocks one GPU reports (an A100 has 81, an H100 about 100): the most a rank may list in
`RankInfo.available_frequencies`, or a profile hold per instruction."""
MAX_FREQ_MHZ = 100_000
MAX_WINDOWS = 2_000
"""Energy windows in one round's result (`ProfilingResult.energy_windows`): 200 s of 100 ms
refreshes; a rank merges refreshes to stay within it."""
MAX_REFRESH_S = 60.0
"""The longest energy-counter refresh period a rank may report."""
SAMPLED_TAIL = 0.25
"""The share of each refresh period that A100 and H100 power sensors sample, at its end
(arXiv 2312.02741): windows carry their busy seconds in it (`EnergyWindow.tail_busy_s`)."""
MAX_SWITCH_LATENCY_S = 10.0
"""A clock switch measured longer than this is a broken measurement."""
MAX_REPLICAS = 65_536
"""Data-parallel replicas one leader may speak for (a job's dp_degree at most)."""
MAX_POWER_W = 100_000.0
"""A power above 100 kW for one GPU is a unit mistake."""

PROTOCOL_VERSION = 2
"""The newest protocol this package speaks. 1: every rank registers, reports and asks for
its schedule (Zeus's protocol). 2: only the job's leaders do (`JobInfo.leaders_per_stage`,
`perseus.domain.layout.Leaders`); each speaks for its group, whose ranks get their schedule
from it over the job's own process group."""

Seconds = Annotated[float, Field(gt=0.0, le=MAX_TIME_S, allow_inf_nan=False)]
"""A measured time: finite, > 0, at most `MAX_TIME_S`."""
Joules = Annotated[float, Field(ge=0.0, le=MAX_ENERGY_J, allow_inf_nan=False)]
"""A measured energy: finite, >= 0, at most `MAX_ENERGY_J`."""
FreqMHz = Annotated[int, Field(gt=0, le=MAX_FREQ_MHZ)]
"""An SM clock in MHz."""
Span = Annotated[float, Field(ge=0.0, le=MAX_TIME_S, allow_inf_nan=False)]
"""A part of a time: finite, >= 0."""


class PipelineSpec(BaseModel):
    """The pipeline a job runs, as it describes itself at registration.

    Attributes:
        schedule: The schedule's name as the job calls it (e.g. ``Schedule1F1B`` or
            ``ScheduleInterleavedZeroBubble``); for messages and plan files.
        num_stages: Pipeline (virtual) stages: the pieces the model is cut into.
        num_microbatches: Microbatches per iteration.
        num_chunks: Stages each pipeline rank holds.
        orders: Per pipeline rank, its instructions of one iteration in execution order,
            each ``[stage, kind, microbatch]``. The coordinator builds the iteration's DAG
            from them; an order that misses, repeats or deadlocks on an instruction is
            refused (422) with a message naming it.
    """

    model_config = ConfigDict(extra="forbid")

    schedule: str = Field(min_length=1, max_length=100)
    num_stages: int = Field(ge=1)
    num_microbatches: int = Field(ge=1)
    num_chunks: int = Field(default=1, ge=1)
    orders: list[list[tuple[int, InstructionKind, int]]] = Field(min_length=1)
    _built: PipelineSchedule | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _check_orders(self) -> PipelineSpec:
        if self._built is not None:  # an instance validated before (JobRecord.register)
            return self
        total = sum(len(o) for o in self.orders)
        if total > MAX_ACTIONS:
            raise ValueError(f"the orders hold {total:,} actions; at most {MAX_ACTIONS:,}")
        try:
            built = PipelineSchedule.from_orders(self.schedule, self.orders, self.num_microbatches)
        except ScheduleError as exc:
            raise ValueError(str(exc)) from None
        if built.num_virtual_stages != self.num_stages:
            raise ValueError(
                f"num_stages is {self.num_stages} but the orders run "
                f"{built.num_virtual_stages} stage(s)"
            )
        if built.num_chunks != self.num_chunks:
            raise ValueError(
                f"num_chunks is {self.num_chunks} but the orders give each rank "
                f"{built.num_chunks} stage(s)"
            )
        self._built = built
        return self

    @property
    def num_ranks(self) -> int:
        """Pipeline ranks (the job's pp_degree)."""
        return len(self.orders)

    def build(self) -> PipelineSchedule:
        """The schedule (and DAG) these orders describe (validated once)."""
        if self._built is None:  # pragma: no cover - set by the validator
            self._built = PipelineSchedule.from_orders(
                self.schedule, self.orders, self.num_microbatches
            )
        return self._built

    @classmethod
    def of(cls, schedule: PipelineSchedule) -> PipelineSpec:
        """The description of a schedule."""
        return cls(
            schedule=schedule.name,
            num_stages=schedule.num_virtual_stages,
            num_microbatches=schedule.num_microbatches,
            num_chunks=schedule.num_chunks,
            orders=schedule.actions(),  # type: ignore[arg-type]
        )


class JobInfo(BaseModel):
    """Training job information a client sends to register a job (``POST /register_job``).

    Attributes:
        job_id: Always empty here: the server generates the id and answers with it (it then
            stores the job as a `JobRecord`). Kept for the seed API's wire format.
        pp_degree: Pipeline parallel degree.
        dp_degree: Data parallel degree.
        tp_degree: Tensor parallel degree.
        world_size: World size of the training job (= pp · dp · tp).
        job_metadata: An optional arbitrary string that describes the job. This will be
            appended to the job ID if given. Typically for logging purposes.
        pipeline: The pipeline the job runs (its schedule's per-rank orders), or None for
            the coordinator's default (its scheduler arguments ``num_microbatches``,
            ``schedule``).
        protocol_version: 1 (the default, Zeus's clients): every rank talks to the
            coordinator. 2: only the leaders do (`PROTOCOL_VERSION`).
        leaders_per_stage: Protocol 2: leaders per pipeline stage (default 1, at most
            dp_degree; `perseus.domain.layout.Leaders` says which ranks they are). None
            under protocol 1.
    """

    job_id: str = ""
    pp_degree: int = Field(ge=1)
    dp_degree: int = Field(ge=1)
    tp_degree: int = Field(ge=1)
    world_size: int = Field(ge=1)
    job_metadata: str | None = None
    pipeline: PipelineSpec | None = None
    protocol_version: int = Field(default=1, ge=1, le=PROTOCOL_VERSION)
    leaders_per_stage: int | None = Field(default=None, ge=1, le=MAX_REPLICAS)

    @field_validator("job_id")
    @classmethod
    def _check_job_id(cls, job_id: str) -> str:
        if job_id:
            raise ValueError("job_id is generated by the server; send an empty string")
        return job_id

    @model_validator(mode="after")
    def _check_world_size(self) -> JobInfo:
        """Product of PP, DP, and TP degree must equal the world size."""
        try:
            self.layout.check_world_size(self.world_size)
        except ConfigurationError as exc:
            raise ValueError(str(exc)) from None
        if self.pipeline is not None and self.pipeline.num_ranks != self.pp_degree:
            raise ValueError(
                f"the pipeline's orders are for {self.pipeline.num_ranks} pipeline rank(s) "
                f"but pp_degree is {self.pp_degree}"
            )
        if self.protocol_version == 1:
            if self.leaders_per_stage is not None:
                raise ValueError(
                    "leaders_per_stage needs protocol_version 2 (under protocol 1 every rank "
                    "talks to the coordinator)"
                )
        else:
            if self.leaders_per_stage is None:
                self.leaders_per_stage = 1
            try:
                Leaders(self.layout, self.leaders_per_stage)
            except ConfigurationError as exc:
                raise ValueError(str(exc)) from None
        return self

    @property
    def layout(self) -> ParallelLayout:
        """The job's parallel layout (the one place its rules live)."""
        return ParallelLayout(self.dp_degree, self.pp_degree, self.tp_degree)

    @property
    def leaders(self) -> Leaders | None:
        """Protocol 2: who leads (talks to the coordinator); None: every rank (protocol 1)."""
        if self.leaders_per_stage is None:
            return None
        return Leaders(self.layout, self.leaders_per_stage)

    @property
    def talking_ranks(self) -> int:
        """How many ranks talk to the coordinator: the leaders, or every rank (protocol 1).
        The round barrier counts these."""
        leaders = self.leaders
        return self.world_size if leaders is None else leaders.count


class JobRecord(JobInfo):
    """A registered job as the server stores it (``job.json``): the request plus its id.

    A `JobInfo` in every other respect, so schedulers take either.
    """

    job_id: str = Field(min_length=1)
    token_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$", repr=False)
    """SHA-256 (hex) of the job credential (`JOB_TOKEN_HEADER`) the coordinator handed
    out; the credential itself is never stored. None: a job registered before
    credentials existed."""

    @field_validator("job_id")
    @classmethod
    def _check_job_id(cls, job_id: str) -> str:  # overrides JobInfo's "must be empty"
        return job_id

    @classmethod
    def register(
        cls, info: JobInfo, scheduler_name: str, *, token_sha256: str | None = None
    ) -> JobRecord:
        """A new record for `info` with a fresh id: timestamp, scheduler, a unique suffix,
        metadata; `token_sha256` is the hash of its credential."""
        job_id = f"{datetime.now().strftime('%F-%H-%M-%S')}+{scheduler_name}+{uuid.uuid4().hex[:8]}"
        if info.job_metadata:
            job_id += f"+{info.job_metadata}"
        # The pipeline goes in as the validated instance: validating its orders again would
        # rebuild its DAG a second time on the request path.
        fields = info.model_dump(exclude={"pipeline"})
        return cls.model_validate(
            {**fields, "job_id": job_id, "pipeline": info.pipeline, "token_sha256": token_sha256}
        )


class RankInfo(BaseModel):
    """Information passed to the server from each rank.

    Attributes:
        rank: Global rank of the reporting process.
        dp_rank: Data parallel rank of the reporting process.
        pp_rank: Pipeline parallel rank of the reporting process.
        tp_rank: Tensor parallel rank of the reporting process.
        available_frequencies: List of available frequencies (MHz) for the rank's GPU, each
            positive and at most `MAX_FREQ_MHZ` (the profile's keys, `OfflineProfilingResult`).
        emulated: The rank's GPU is emulated (`GPU.emulated`): what it measures is the
            emulator's model, and the profile and plan made from it say so.
        replicas: Protocol 2 (a leader): the data-parallel replicas of its stage it speaks
            for, ascending (its block, `perseus.domain.layout.Leaders.block`); the GPUs of
            its whole group were checked in-job to be this one's type and clocks. None:
            protocol 1, the rank speaks for itself.
    """

    rank: int = Field(ge=0)
    dp_rank: int = Field(ge=0)
    pp_rank: int = Field(ge=0)
    tp_rank: int = Field(ge=0)
    available_frequencies: list[FreqMHz] = Field(max_length=MAX_FREQUENCIES)
    emulated: bool = False
    energy_refresh_s: float | None = Field(
        default=None, ge=0.0, le=MAX_REFRESH_S, allow_inf_nan=False
    )
    """How often the GPU's energy counter refreshes, as the rank measured it at start
    (0: continuous; None: not measured, e.g. no counter). Rounds are sized from it."""
    replicas: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None, min_length=1, max_length=MAX_REPLICAS
    )
    switch_latency_s: float | None = Field(
        default=None,
        ge=0.0,
        le=MAX_SWITCH_LATENCY_S,
        allow_inf_nan=False,
        description="how long this rank's GPU took to apply a locked SM clock, measured by the "
        "rank (`perseus.client.frequency.measure_switch_latency`); a leader's is the slowest "
        "of its group; None: not measured",
    )

    @field_validator("replicas")
    @classmethod
    def _check_replicas(cls, replicas: list[int] | None) -> list[int] | None:
        if replicas is not None and any(a >= b for a, b in itertools.pairwise(replicas)):
            raise ValueError("replicas must be ascending data-parallel ranks, each once")
        return replicas


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
    """

    model_config = ConfigDict(extra="forbid")

    energy_j: Joules
    time_s: Seconds
    busy_s: list[Span] = Field(max_length=MAX_ACTIONS)
    tail_s: Span = 0.0
    tail_busy_s: list[Span] = Field(default_factory=list, max_length=MAX_ACTIONS)

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

    A leader's result speaks for its whole group (`perseus.client.leaders`, gathered
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


_TimeByFreq = Annotated[dict[FreqMHz, Seconds], Field(max_length=MAX_FREQUENCIES)]
_EnergyByFreq = Annotated[dict[FreqMHz, Joules], Field(max_length=MAX_FREQUENCIES)]


class OfflineProfilingResult(BaseModel):
    """Profiling results generated from offline profiling each instruction.

    Times are finite and > 0, energies finite and >= 0 (bounded as in `ProfilingResult`),
    frequencies positive MHz, at most `MAX_FREQUENCIES` per instruction.

    Attributes:
        rank: Global rank of the reporting client.
        dp_rank, pp_rank, tp_rank: Parallel ranks of the reporting process.
        stage: The pipeline (virtual) stage these numbers are for, when the pipeline rank
            holds several (interleaved, ZBV); None means the stage is `pp_rank` (and a
            stage equal to `pp_rank` is stored as None, so that both spellings compare equal).
        forward_time: Frequency → average forward computation time (s).
        forward_energy: Frequency → average forward computation energy (J).
        backward_time: Frequency → average backward computation time (s).
        backward_energy: Frequency → average backward computation energy (J).
        backward_input_time, backward_input_energy, backward_weight_time,
        backward_weight_energy: The same for the halves of a split backward (empty when
            the schedule runs full backwards).
        emulated: Measured on an emulated GPU (the CSV's ``emulated`` column).
    """

    rank: int = Field(ge=0)
    dp_rank: int = Field(ge=0)
    pp_rank: int = Field(ge=0)
    tp_rank: int = Field(ge=0)
    stage: int | None = Field(default=None, ge=0)
    forward_time: _TimeByFreq
    forward_energy: _EnergyByFreq
    backward_time: _TimeByFreq = Field(default_factory=dict)
    backward_energy: _EnergyByFreq = Field(default_factory=dict)
    backward_input_time: _TimeByFreq = Field(default_factory=dict)
    backward_input_energy: _EnergyByFreq = Field(default_factory=dict)
    backward_weight_time: _TimeByFreq = Field(default_factory=dict)
    backward_weight_energy: _EnergyByFreq = Field(default_factory=dict)
    emulated: bool = False

    @model_validator(mode="after")
    def _normalise_stage(self) -> OfflineProfilingResult:
        if self.stage == self.pp_rank:
            self.stage = None
        return self

    @property
    def pipeline_stage(self) -> int:
        """The pipeline (virtual) stage: `stage`, or `pp_rank` when that is None."""
        return self.pp_rank if self.stage is None else self.stage


class InstructionProfilingResult(RootModel[list[OfflineProfilingResult]]):
    """Time and energy profiling results for each instruction in each stage."""

    def rows(self) -> list[ProfileRow]:
        """One row per entry (rank and stage), instruction and frequency (frequencies
        descending); the row's stage is the entry's `pipeline_stage`."""
        rows: list[ProfileRow] = []
        for res in self.root:
            for instruction in INSTRUCTIONS:
                times: dict[int, float] = getattr(res, f"{instruction}_time")
                energies: dict[int, float] = getattr(res, f"{instruction}_energy")
                for freq in sorted(times, reverse=True):
                    if freq not in energies:
                        raise ProfileError(
                            f"rank {res.rank} stage {res.pipeline_stage}: {instruction} at "
                            f"{freq} MHz has a time but no energy"
                        )
                    rows.append(
                        ProfileRow(
                            res.rank,
                            res.dp_rank,
                            res.pp_rank,
                            res.tp_rank,
                            res.pipeline_stage,
                            instruction,
                            freq,
                            times[freq],
                            energies[freq],
                            res.emulated,
                        )
                    )
        return rows

    def to_csv(self, filepath: str | os.PathLike[str]) -> None:
        """Serialize and save this object into a CSV file.

        Columns: rank, dp_rank, pp_rank, tp_rank, stage, instruction, frequency, time, energy

        Notes:
            - `rank` is the global rank of the process.
            - `stage` is the pipeline (virtual) stage: `pp_rank` unless the pipeline rank
              holds several stages (interleaved, ZBV), then one of those.
            - All ranks and `stage` are zero-indexed.
            - `instruction` is one of "forward", "backward", "backward_input",
              "backward_weight".
            - `time` and `energy` are already averaged over profiling iterations.
            - An ``emulated`` column (true/false) follows when some entry is `emulated`.
        """
        write_profile_rows(filepath, self.rows())

    @classmethod
    def from_csv(cls, filepath: str | os.PathLike[str]) -> InstructionProfilingResult:
        """Read a profile CSV, in the long form `to_csv` writes or the short
        ``stage,instruction,frequency,time,energy`` form (then rank = pp_rank = stage).
        One entry per (rank, dp_rank, pp_rank, tp_rank, stage)."""
        by_rank: dict[tuple[int, int, int, int, int], dict[str, dict[int, float]]] = {}
        emulated: set[tuple[int, int, int, int, int]] = set()
        for row in read_profile_rows(filepath):
            key = (row.rank, row.dp_rank, row.pp_rank, row.tp_rank, row.stage)
            entry = by_rank.setdefault(
                key, {f"{i}_{q}": {} for i in INSTRUCTIONS for q in ("time", "energy")}
            )
            entry[f"{row.instruction}_time"][row.frequency] = row.time
            entry[f"{row.instruction}_energy"][row.frequency] = row.energy
            if row.emulated:
                emulated.add(key)
        return cls(
            [
                OfflineProfilingResult(
                    rank=key[0],
                    dp_rank=key[1],
                    pp_rank=key[2],
                    tp_rank=key[3],
                    stage=key[4],
                    emulated=key in emulated,
                    **data,
                )
                for key, data in sorted(by_rank.items())
            ]
        )


class _ProfilingResultList(RootModel[list[ProfilingResult]]):
    pass


class _FrequencyScheduleList(RootModel[list[FrequencySchedule]]):
    pass


class _RankInfoList(RootModel[list[RankInfo]]):
    pass


async def save_prof(
    data: list[ProfilingResult], directory: str | os.PathLike[str], schedule_num: int
) -> None:
    """Save a list of `ProfilingResult`s in the designated directory."""
    text = _ProfilingResultList(data).model_dump_json()
    await asyncio.to_thread(atomic_write_text, JobDir(directory).results(schedule_num), text)


def load_prof(directory: str | os.PathLike[str], schedule_num: int) -> list[ProfilingResult]:
    """Load a list of `ProfilingResult`s saved in the designated directory."""
    text = (JobDir(directory).results(schedule_num)).read_text()
    return _ProfilingResultList.model_validate_json(text).root


async def save_sched(
    data: list[FrequencySchedule], directory: str | os.PathLike[str], schedule_num: int
) -> None:
    """Save a list of `FrequencySchedule`s in the designated directory."""
    text = _FrequencyScheduleList(data).model_dump_json()
    await asyncio.to_thread(atomic_write_text, JobDir(directory).schedules(schedule_num), text)


def load_sched(directory: str | os.PathLike[str], schedule_num: int) -> list[FrequencySchedule]:
    """Load a list of `FrequencySchedule`s saved in the designated directory."""
    text = (JobDir(directory).schedules(schedule_num)).read_text()
    return _FrequencyScheduleList.model_validate_json(text).root


async def save_ranks(data: list[RankInfo], directory: str | os.PathLike[str]) -> None:
    """Save a list of `RankInfo`s in the designated directory."""
    text = _RankInfoList(data).model_dump_json()
    await asyncio.to_thread(atomic_write_text, JobDir(directory).ranks, text)


def load_ranks(directory: str | os.PathLike[str]) -> list[RankInfo]:
    """Load a list of `RankInfo`s saved in the designated directory."""
    text = (JobDir(directory).ranks).read_text()
    return _RankInfoList.model_validate_json(text).root
