"""What a job and its ranks say at registration: `PipelineSpec`, `JobInfo`, `JobRecord`,
`RankInfo`."""

from __future__ import annotations

import itertools
import uuid
from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from perseus.domain.layout import Leaders, ParallelLayout
from perseus.domain.schedule import MAX_ACTIONS, PipelineSchedule
from perseus.errors import ConfigurationError, ScheduleError
from perseus.protocol.limits import (
    MAX_FREQUENCIES,
    MAX_POWER_W,
    MAX_REFRESH_S,
    MAX_REPLICAS,
    MAX_SWITCH_LATENCY_S,
    PROTOCOL_VERSION,
    FreqMHz,
    InstructionKind,
)

__all__ = ["JobInfo", "JobRecord", "PipelineSpec", "RankInfo"]


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
    power_limit_w: float | None = Field(
        default=None,
        ge=1.0,
        le=MAX_POWER_W,
        allow_inf_nan=False,
        description="the power limit in force on the rank's GPU, W, as the rank read it at start "
        "(`GPU.get_power_limit_mw` / 1000; NVML's enforced limit); a leader sends its own GPU's; "
        "None: not read (the GPU refused, or an older client)",
    )
    """The GPU's power limit in force, W (see its description): no power a row of its profile
    holds can be above it."""
    idle_power_w: float | None = Field(
        default=None,
        ge=0.0,
        le=MAX_POWER_W,
        allow_inf_nan=False,
        description="the power the rank's GPU drew while idle, W, measured by the rank at start "
        "from its energy counter (the energy between the first and the last refresh it saw "
        "while nothing ran, over the time between them; `perseus.client.gpu.meter.EnergyReader`); "
        "a leader sends its own GPU's; None: not measured (no counter, a counter that did not "
        "refresh steadily, or an older client)",
    )
    """The GPU's idle power, W (see its description): no power a row of its profile holds
    can be below it. At most `power_limit_w` when both are given."""
    replicas: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None, min_length=1, max_length=MAX_REPLICAS
    )
    switch_latency_s: float | None = Field(
        default=None,
        ge=0.0,
        le=MAX_SWITCH_LATENCY_S,
        allow_inf_nan=False,
        description="how long this rank's GPU took to apply a locked SM clock, measured by the "
        "rank (`perseus.client.gpu.frequency.measure_switch_latency`); a leader's is the slowest "
        "of its group; None: not measured",
    )

    @model_validator(mode="after")
    def _check_powers(self) -> RankInfo:
        limit, idle = self.power_limit_w, self.idle_power_w
        if limit is not None and idle is not None and idle > limit:
            raise ValueError(
                f"idle_power_w {idle!r} W is above power_limit_w {limit!r} W: a GPU does not "
                "draw more idle than its limit allows (was it busy while measured?)"
            )
        return self

    @field_validator("replicas")
    @classmethod
    def _check_replicas(cls, replicas: list[int] | None) -> list[int] | None:
        if replicas is not None and any(a >= b for a, b in itertools.pairwise(replicas)):
            raise ValueError("replicas must be ascending data-parallel ranks, each once")
        return replicas
