"""What `zeus_power.master.ZeusMaster` drives: a recurring training `Job` (its command with
placeholders, its learning-rate scaling), the `HistoryEntry` of each trial, and the
`BatchSizeOptimizerBackend` it asks for batch sizes."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from zeus_power.bso.models import JobConfig, JobState, TrialAssignment, TrialRecord, TrialResult
from zeus_power.errors import ZeusConfigError

__all__ = ["BatchSizeOptimizerBackend", "HistoryEntry", "Job"]

_PLACEHOLDERS = ("batch_size", "learning_rate", "seed", "max_epochs", "result_path", "log_dir")


class BatchSizeOptimizerBackend(Protocol):
    """What `ZeusMaster` needs of a batch-size optimizer (`LocalBatchSizeOptimizer`,
    or the server's `BSOService`)."""

    def register_job(self, config: JobConfig) -> tuple[JobState, bool]: ...

    def next_trial(self, job_id: str) -> TrialAssignment: ...

    def report(self, job_id: str, trial_number: int, result: TrialResult) -> TrialRecord: ...


@dataclass(frozen=True, kw_only=True)
class Job:
    """A recurring training job.

    `command` is the argv of the training script; its arguments may contain the
    placeholders `{batch_size}`, `{learning_rate}`, `{seed}`, `{max_epochs}`,
    `{result_path}` and `{log_dir}`, replaced verbatim (no format-string evaluation).
    """

    name: str
    """Job name; the batch-size optimizer's job id."""
    command: tuple[str, ...]
    default_batch_size: int
    default_learning_rate: float
    target_metric: float
    max_epochs: int
    higher_is_better_metric: bool = True
    lr_scaling: Literal["none", "linear", "sqrt"] = "sqrt"
    """How the learning rate follows the batch size (sqrt suits Adam, linear SGD)."""
    workdir: str | None = None
    """Working directory of the training subprocess (default: the master's)."""

    def __post_init__(self) -> None:
        if not self.command:
            raise ZeusConfigError(f"Job {self.name!r}: command is empty; give the script argv.")
        if self.default_batch_size <= 0:
            raise ZeusConfigError(
                f"Job {self.name!r}: default_batch_size={self.default_batch_size} must be > 0."
            )
        if not self.default_learning_rate > 0:
            raise ZeusConfigError(
                f"Job {self.name!r}: default_learning_rate={self.default_learning_rate} "
                "must be > 0."
            )
        if self.max_epochs < 1:
            raise ZeusConfigError(f"Job {self.name!r}: max_epochs={self.max_epochs} must be >= 1.")
        object.__setattr__(self, "command", tuple(self.command))

    def scale_lr(self, batch_size: int) -> float:
        """The learning rate for `batch_size`, scaled from the default one."""
        ratio = batch_size / self.default_batch_size
        if self.lr_scaling == "linear":
            return self.default_learning_rate * ratio
        if self.lr_scaling == "sqrt":
            return self.default_learning_rate * math.sqrt(ratio)
        return self.default_learning_rate

    def gen_command(self, values: Mapping[str, object]) -> list[str]:
        """The argv with placeholders replaced by `values`."""
        argv = []
        for arg in self.command:
            for key in _PLACEHOLDERS:
                if key in values:
                    arg = arg.replace("{" + key + "}", str(values[key]))
            argv.append(arg)
        return argv

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class HistoryEntry:
    """One trial of one recurrence."""

    rec_i: int
    try_i: int
    batch_size: int
    energy_j: float
    time_s: float
    reached: bool
    cost: float
    power_limit_w: int | None = None
    """Power limit used, when the driver knows it (the simulator); None otherwise."""
    stage: str = field(default="")
    emulated: bool = False
    """The trial ran on emulated GPUs (its `TrainingResult` said so): a model's numbers."""

    # Zeus-compatible names.
    @property
    def bs(self) -> int:
        """Alias of `batch_size`."""
        return self.batch_size

    @property
    def energy(self) -> float:
        """Alias of `energy_j`."""
        return self.energy_j

    @property
    def time(self) -> float:
        """Alias of `time_s`."""
        return self.time_s
