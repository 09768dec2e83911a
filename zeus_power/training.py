"""What a training script launched by `ZeusMaster` sees, and what it hands back.

`ZeusMaster` runs the script once per trial with the `ZEUS_*` variables below set;
`TrainingEnv.from_environ()` parses them. The script reports its energy, time and whether
it reached the target metric by writing a `TrainingResult` (`TrainingResult.write`) to
`ZEUS_RESULT_PATH`. This module needs neither the batch-size optimizer nor the device
layer, so a training script can import it alone.

Environment of a training subprocess:

| variable                  | meaning                                                   |
|---------------------------|-----------------------------------------------------------|
| ZEUS_JOB_ID               | the job's name                                            |
| ZEUS_BATCH_SIZE           | batch size to train with                                  |
| ZEUS_LEARNING_RATE        | learning rate, scaled from the default for the batch size |
| ZEUS_SEED                 | random seed                                               |
| ZEUS_ETA_KNOB             | η of the cost                                             |
| ZEUS_COST_THRESH          | stop when the next epoch would pass this cost ("inf")     |
| ZEUS_MAX_POWER_W          | max_power of the cost (max power limit × GPUs)            |
| ZEUS_TARGET_METRIC        | target validation metric                                  |
| ZEUS_HIGHER_IS_BETTER     | "1" if the metric converges upwards                       |
| ZEUS_MAX_EPOCHS           | epoch budget                                              |
| ZEUS_LOG_DIR              | directory for logs                                        |
| ZEUS_RESULT_PATH          | where to write the `TrainingResult` JSON                  |
| ZEUS_MONITOR_PATH         | power monitor binary, if any (Zeus compatibility)         |
| ZEUS_PROFILE_PARAMS       | "warmup_iters,measure_iters" for the power-limit optimizer|
| ZEUS_USE_OPTIMAL_PL       | "0" in observer mode (always the max power limit)         |
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from zeus_power.errors import ZeusConfigError

__all__ = ["TrainingEnv", "TrainingResult"]


class TrainingResult(BaseModel):
    """What a training subprocess writes to `ZEUS_RESULT_PATH` (also Zeus's field names)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    energy_j: float = Field(ge=0.0, validation_alias=AliasChoices("energy_j", "energy"))
    time_s: float = Field(ge=0.0, validation_alias=AliasChoices("time_s", "time"))
    reached: bool
    epochs: int | None = Field(default=None, ge=0)
    emulated: bool = Field(default=False, exclude_if=lambda emulated: not emulated)
    """Measured on emulated GPUs (e.g. `ZeusMonitor.emulated`); absent means real GPUs."""

    def write(self, path: str | Path) -> None:
        """Write this result as JSON to `path`."""
        Path(path).write_text(self.model_dump_json())


@dataclass(frozen=True, kw_only=True)
class TrainingEnv:
    """The environment `ZeusMaster` gives a training subprocess, parsed."""

    job_id: str
    batch_size: int
    learning_rate: float
    seed: int
    eta_knob: float
    cost_thresh: float
    max_power_w: float
    target_metric: float
    higher_is_better_metric: bool
    max_epochs: int
    log_dir: Path
    result_path: Path
    monitor_path: str | None = None
    profile_warmup_iters: int = 10
    profile_measure_iters: int = 40
    use_optimal_pl: bool = True

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> TrainingEnv:
        """Parse `environ` (default `os.environ`); names the missing or bad variable."""
        env = os.environ if environ is None else environ

        def get(name: str) -> str:
            try:
                return env[name]
            except KeyError:
                raise ZeusConfigError(
                    f"{name} is not set: run this script through ZeusMaster.run_job."
                ) from None

        try:
            warmup, measure = (int(x) for x in env.get("ZEUS_PROFILE_PARAMS", "10,40").split(","))
            return cls(
                job_id=get("ZEUS_JOB_ID"),
                batch_size=int(get("ZEUS_BATCH_SIZE")),
                learning_rate=float(get("ZEUS_LEARNING_RATE")),
                seed=int(get("ZEUS_SEED")),
                eta_knob=float(get("ZEUS_ETA_KNOB")),
                cost_thresh=float(get("ZEUS_COST_THRESH")),
                max_power_w=float(get("ZEUS_MAX_POWER_W")),
                target_metric=float(get("ZEUS_TARGET_METRIC")),
                higher_is_better_metric=get("ZEUS_HIGHER_IS_BETTER") == "1",
                max_epochs=int(get("ZEUS_MAX_EPOCHS")),
                log_dir=Path(get("ZEUS_LOG_DIR")),
                result_path=Path(get("ZEUS_RESULT_PATH")),
                monitor_path=env.get("ZEUS_MONITOR_PATH") or None,
                profile_warmup_iters=warmup,
                profile_measure_iters=measure,
                use_optimal_pl=env.get("ZEUS_USE_OPTIMAL_PL", "1") == "1",
            )
        except ValueError as exc:
            raise ZeusConfigError(f"Bad ZEUS_* environment variable: {exc}") from exc

    def converged(self, metric: float) -> bool:
        """Whether `metric` reaches the target."""
        if self.higher_is_better_metric:
            return metric >= self.target_metric
        return metric <= self.target_metric
