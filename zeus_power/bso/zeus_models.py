"""Zeus 0.16's batch-size optimizer wire models, so that Zeus's own client talks to our server.

Zeus's `zeus.optimizer.batch_size.client.BatchSizeOptimizer` sends these bodies to the
routes under ``/zeus`` (`zeus_power.bso.server.routes.zeus`); the names and shapes are
Zeus's (``zeus/optimizer/batch_size/common.py``), the bounds are ours (`zeus_power.bso.models`).
They are translated to and from our models here and nowhere else:

- `ZeusJobSpec` (Zeus's ``JobSpecFromClient``): our `JobConfig`, with Zeus's
  ``max_power`` the maximum power of *all* GPUs (ours is per GPU, times
  ``number_of_gpus``), a ``job_id_prefix`` and an optional ``job_id`` (None: the server
  makes one, ``PREFIX-xxxxxxxx``). Where Zeus accepts what our policy does not
  (``mab_num_explorations=0``, ``beta_knob`` below 1, duplicate batch sizes), the
  registration is refused with 422 naming the field.
- `ZeusCreatedJob` (``CreatedJob``): the registered job, as Zeus's client reads it back.
- `ZeusTrialId` (``TrialId``), `ZeusTrainingResult` (``TrainingResult``: time and energy
  so far, the epoch's metric) and `ZeusReportResponse` (``ReportResponse``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from zeus_power.bso.models import (
    MAX_ENERGY_J,
    MAX_GPUS,
    MAX_POWER_W,
    MAX_SQL_INT,
    MAX_TIME_S,
    BatchSize,
    Finite,
    JobConfig,
)

__all__ = [
    "ZeusCreatedJob",
    "ZeusJobSpec",
    "ZeusReportResponse",
    "ZeusTrainingResult",
    "ZeusTrialId",
]

JOB_ID_PATTERN = r"^[A-Za-z0-9_.:+\-]{1,128}$"
"""A job id, as our own routes take it."""
PREFIX_PATTERN = r"^[A-Za-z0-9_.:+\-]{1,119}$"
"""A job id prefix: room is left for the ``-xxxxxxxx`` the server appends."""


class _ZeusModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _ZeusJobFields(_ZeusModel):
    """The fields Zeus's ``JobParams`` and ``GpuConfig`` share, with Zeus's defaults."""

    job_id_prefix: str = Field(pattern=PREFIX_PATTERN)
    batch_sizes: list[int] = Field(min_length=1, max_length=1024)
    default_batch_size: BatchSize
    eta_knob: float = 0.5
    beta_knob: float | None = 2.0
    target_metric: float = 0.5
    higher_is_better_metric: bool = True
    max_epochs: int = 100
    num_pruning_rounds: int = 2
    window_size: int = 0
    mab_prior_mean: float = 0.0
    mab_prior_precision: float = 0.0
    mab_num_explorations: int = 2
    mab_seed: int | None = None
    max_power: float = Field(gt=0.0, le=MAX_POWER_W * MAX_GPUS, allow_inf_nan=False)
    """Maximum power limit of all the job's GPUs together, in watts."""
    number_of_gpus: int = Field(ge=1, le=MAX_GPUS)
    gpu_model: str = Field(min_length=1, max_length=200)


class ZeusJobSpec(_ZeusJobFields):
    """Zeus's ``JobSpecFromClient``: what ``POST /zeus/jobs`` takes."""

    job_id: str | None = Field(default=None, pattern=JOB_ID_PATTERN)
    _config: JobConfig = PrivateAttr()

    @model_validator(mode="after")
    def _check(self) -> ZeusJobSpec:
        if self.job_id is not None and not self.job_id.startswith(self.job_id_prefix):
            raise ValueError(
                f"job_id {self.job_id!r} does not start with job_id_prefix {self.job_id_prefix!r}"
            )
        fields = self.model_dump(exclude={"job_id", "job_id_prefix", "max_power"})
        try:
            self._config = JobConfig(
                **fields,
                job_id=self.job_id or f"{self.job_id_prefix}-00000000",
                max_power_w=self.max_power / self.number_of_gpus,
            )
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(x) for x in e['loc']) or 'job'}: {e['msg']}"
                for e in exc.errors()[:10]
            )
            raise ValueError(f"this server cannot optimise the job as given: {problems}") from None
        return self

    def to_config(self, job_id: str) -> JobConfig:
        """Our `JobConfig` of this spec, under `job_id` (the given one or a made one)."""
        return self._config.model_copy(update={"job_id": job_id})


class ZeusCreatedJob(_ZeusJobFields):
    """Zeus's ``CreatedJob``: the registered job as ``POST /zeus/jobs`` answers it."""

    job_id: str

    @classmethod
    def of(cls, config: JobConfig, job_id_prefix: str) -> ZeusCreatedJob:
        """The registered `config` in Zeus's shape."""
        fields = config.model_dump(exclude={"job_id", "max_power_w"})
        return cls(
            **fields,
            job_id=config.job_id,
            job_id_prefix=job_id_prefix,
            max_power=config.total_max_power_w,
        )


class ZeusTrialId(_ZeusModel):
    """Zeus's ``TrialId``: a trial, as ``GET /zeus/jobs/batch_size`` hands it out."""

    job_id: str = Field(pattern=JOB_ID_PATTERN)
    batch_size: BatchSize
    trial_number: int = Field(ge=1, le=MAX_SQL_INT)


class ZeusTrainingResult(ZeusTrialId):
    """Zeus's ``TrainingResult``: one epoch's report (time and energy since training began)."""

    time: float = Field(ge=0.0, le=MAX_TIME_S, allow_inf_nan=False)
    """Seconds of training so far."""
    energy: float = Field(ge=0.0, le=MAX_ENERGY_J, allow_inf_nan=False)
    """Joules over all the job's GPUs so far."""
    metric: Finite
    """The validation metric after `current_epoch`."""
    current_epoch: int = Field(ge=1, le=MAX_SQL_INT)
    """Epochs run so far (1-based)."""


class ZeusReportResponse(_ZeusModel):
    """Zeus's ``ReportResponse``: whether the trial stops, and whether it converged."""

    stop_train: bool
    converged: bool
    message: str
