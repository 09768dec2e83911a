"""Wire models of the batch-size optimizer, shared by the server and the client.

Named by role: `JobSpec` is what a user writes, `JobConfig` is what the client registers
(the spec plus what it learned from its GPUs), `TrialAssignment` is what the server hands
out, `TrialResult` is what the client reports back, `TrialRecord` and `JobState` are what
the server shows. All models reject unknown fields.
"""

from __future__ import annotations

import zlib
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator, model_validator

__all__ = [
    "JobConfig",
    "JobSpec",
    "JobStage",
    "JobState",
    "TrialAssignment",
    "TrialList",
    "TrialRecord",
    "TrialResult",
    "TrialStage",
    "TrialStatus",
]

TrialStage = Literal["pruning", "filler", "mab"]
"""Why a trial was handed out: a pruning-round exploration, a stand-in handed out while a
pruning trial is in flight, or a Thompson-sampling pick."""

TrialStatus = Literal["dispatched", "succeeded", "failed", "timed_out"]
"""`dispatched` until the client reports; `succeeded` when it reached the target metric;
`timed_out` when the server's `trial_timeout_s` passed without a report."""

JobStage = Literal["pruning", "mab", "infeasible"]
"""Where the job's exploration stands; `infeasible` when no batch size reached the target."""


# Every number is bounded and finite where it enters (issue #30): an integer must fit the
# database's INTEGER column on every backend (32-bit on PostgreSQL), and no float may be
# NaN or infinite (it would be stored, or break the JSON of every later answer).
MAX_SQL_INT = 2**31 - 1
"""The largest batch size, trial number or epoch count (a 32-bit SQL INTEGER)."""
MAX_BATCH_SIZES = 1024
"""Batch sizes one job may explore."""
MAX_SEED = 2**63 - 1
MAX_ENERGY_J = 1e15
"""A trial's energy over all its GPUs: 1 MW for 30 years."""
MAX_TIME_S = 1e9
"""A trial's duration: 30 years."""
MAX_POWER_W = 1e5
"""A GPU's maximum power limit."""
MAX_GPUS = 10**6
MAX_ABS_METRIC = 1e15
"""Bound of the target metric and the prior mean (any accuracy, loss or cost)."""

BatchSize = Annotated[int, Field(gt=0, le=MAX_SQL_INT)]
"""A batch size: positive, at most `MAX_SQL_INT`."""
Finite = Annotated[float, Field(ge=-MAX_ABS_METRIC, le=MAX_ABS_METRIC, allow_inf_nan=False)]
"""A finite number within ±`MAX_ABS_METRIC`."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class JobSpec(_Model):
    """A recurring training job whose batch size is to be optimised."""

    job_id: str = Field(pattern=r"^[A-Za-z0-9_.:+\-]{1,128}$")
    """Unique, stable id of the job; recurrences of the job share it."""
    batch_sizes: list[int] = Field(min_length=1, max_length=MAX_BATCH_SIZES)
    """Feasible batch sizes (positive, distinct, at most `MAX_SQL_INT`); stored ascending."""
    default_batch_size: BatchSize
    """The batch size the job would use without the optimizer; one of `batch_sizes`."""
    eta_knob: float = Field(default=0.5, ge=0.0, le=1.0, allow_inf_nan=False)
    """η of the cost η·energy + (1 − η)·max_power·time."""
    beta_knob: float | None = Field(default=2.0, ge=1.0, le=1e6, allow_inf_nan=False)
    """Early stop when a trial's cost passes β × the best cost so far; None disables it."""
    target_metric: Finite = 0.5
    """Validation metric that counts as converged."""
    higher_is_better_metric: bool = True
    """Whether the metric converges upwards (accuracy) or downwards (loss)."""
    max_epochs: int = Field(default=100, ge=1, le=MAX_SQL_INT)
    """A trial that has not converged after this many epochs fails."""
    num_pruning_rounds: int = Field(default=2, ge=0, le=1000)
    """Pruning rounds before Thompson sampling; 0 samples over all batch sizes at once."""
    window_size: int = Field(default=10, ge=0, le=MAX_SQL_INT)
    """Thompson sampling uses each arm's latest `window_size` costs; 0 uses all of them."""
    mab_prior_mean: Finite = 0.0
    """Prior mean of an arm's reward (−cost)."""
    mab_prior_precision: float = Field(default=0.0, ge=0.0, le=1e12, allow_inf_nan=False)
    """Prior precision of an arm's reward; 0 is uninformative."""
    mab_num_explorations: int = Field(default=2, ge=1, le=MAX_SQL_INT)
    """Observations each surviving arm needs before sampling starts."""
    mab_seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    """Seed of Thompson sampling (0 ≤ seed < 2**63); None derives one from `job_id`."""

    @field_validator("batch_sizes")
    @classmethod
    def _check_batch_sizes(cls, value: list[int]) -> list[int]:
        bad = [b for b in value if not 0 < b <= MAX_SQL_INT]
        if bad:
            raise ValueError(
                f"batch sizes must be positive and at most {MAX_SQL_INT}, got {bad[:10]}"
            )
        if len(set(value)) != len(value):
            raise ValueError(f"batch sizes must be distinct, got {value}")
        return sorted(value)

    @model_validator(mode="after")
    def _check_default(self) -> JobSpec:
        if self.default_batch_size not in self.batch_sizes:
            raise ValueError(
                f"default_batch_size={self.default_batch_size} is not one of the batch sizes "
                f"{self.batch_sizes}; add it to batch_sizes"
            )
        return self

    @property
    def seed(self) -> int:
        """The Thompson-sampling seed in force."""
        if self.mab_seed is not None:
            return self.mab_seed
        return zlib.crc32(self.job_id.encode())

    def converged(self, metric: float) -> bool:
        """Whether `metric` reaches the target."""
        if self.higher_is_better_metric:
            return metric >= self.target_metric
        return metric <= self.target_metric


class JobConfig(JobSpec):
    """A job spec plus the facts about its GPUs that the cost needs (sent by the client)."""

    max_power_w: float = Field(gt=0.0, le=MAX_POWER_W, allow_inf_nan=False)
    """Maximum power limit of one GPU, in watts."""
    number_of_gpus: int = Field(default=1, ge=1, le=MAX_GPUS)
    """GPUs the job trains on; the cost uses max_power_w × number_of_gpus."""
    gpu_model: str = Field(default="", max_length=200)
    """GPU product name, for the record."""

    @property
    def total_max_power_w(self) -> float:
        """max_power_w × number_of_gpus: the `max_power` of the cost."""
        return self.max_power_w * self.number_of_gpus


class TrialAssignment(_Model):
    """The server's answer to "which batch size now?"."""

    job_id: str
    trial_number: int = Field(ge=1)
    """1-based, increasing per job; name this trial when reporting."""
    batch_size: int
    stage: TrialStage
    round: int | None = None
    """Pruning round of a `pruning` trial."""
    cost_ub: float | None = None
    """Stop early when the trial's cost passes this (β × best cost); None: no bound yet."""


class TrialResult(_Model):
    """What the client reports when a trial ends."""

    energy_j: float = Field(ge=0.0, le=MAX_ENERGY_J, allow_inf_nan=False)
    """Energy over all GPUs of the job (finite, at most `MAX_ENERGY_J`)."""
    time_s: float = Field(ge=0.0, le=MAX_TIME_S, allow_inf_nan=False)
    converged: bool
    """Whether the target metric was reached."""
    epochs: int | None = Field(default=None, ge=0, le=MAX_SQL_INT)
    """Epochs run, for the record."""


class TrialRecord(_Model):
    """One trial as the server stores it."""

    job_id: str
    trial_number: int
    batch_size: int
    stage: TrialStage
    round: int | None = None
    status: TrialStatus
    energy_j: float | None = None
    time_s: float | None = None
    cost: float | None = None
    converged: bool | None = None
    epochs: int | None = None


class JobState(_Model):
    """A job's config and where its exploration stands."""

    config: JobConfig
    stage: JobStage
    survivors: list[int] | None = None
    """Batch sizes that survived pruning (None while pruning)."""
    best_batch_size: int | None = None
    """Batch size of the cheapest converged trial."""
    best_cost: float | None = None
    num_trials: int = 0


TrialList = TypeAdapter(list[TrialRecord])
"""Validator for the list of a job's trials (GET /jobs/{job_id}/trials)."""
