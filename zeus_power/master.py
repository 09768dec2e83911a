"""`ZeusMaster`: drive a recurring training job across recurrences.

The master launches the training script once per trial as a subprocess and controls it
through environment variables (see `TrainingEnv`); the script reports its energy, time
and whether it reached the target metric by writing a `TrainingResult` JSON file to
`ZEUS_RESULT_PATH`. The batch size of each trial comes from a batch-size optimizer with
the `BSOService` methods (`LocalBatchSizeOptimizer` in-process, by default).

The protocol's two halves, `TrainingEnv` and `TrainingResult`, live in
`zeus_power.training` (re-exported here), with the table of the environment variables;
`Job`, `HistoryEntry` and `BatchSizeOptimizerBackend` in `zeus_power.job` (re-exported).
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
from collections.abc import Sequence
from dataclasses import asdict
from datetime import datetime
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from zeus_power.bso.local import LocalBatchSizeOptimizer
from zeus_power.bso.models import JobConfig, TrialResult
from zeus_power.errors import ZeusConfigError, ZeusMasterError
from zeus_power.job import BatchSizeOptimizerBackend, HistoryEntry, Job
from zeus_power.metric import check_eta_knob
from zeus_power.training import TrainingEnv, TrainingResult

__all__ = [
    "BatchSizeOptimizerBackend",
    "HistoryEntry",
    "Job",
    "TrainingEnv",
    "TrainingResult",
    "ZeusMaster",
]

logger = logging.getLogger(__name__)


class ZeusMaster:
    """Drives a job across recurrences, searching for and exploiting the best batch size.

    Args:
        batch_size_optimizer: Where batch sizes come from (default: a fresh
            `LocalBatchSizeOptimizer`). Its job id is the job's name.
        log_base: Directory under which a log directory per `run` is created.
        monitor_path: Power monitor binary passed on as ZEUS_MONITOR_PATH (may be None).
        seed: Seed of the per-recurrence training seeds and of Thompson sampling.
        observer_mode: Scripts keep the max power limit (ZEUS_USE_OPTIMAL_PL=0).
        profile_warmup_iters: Warmup iterations per power limit, passed to the script.
        profile_measure_iters: Measured iterations per power limit, passed to the script.
        max_power_w: Max power limit of one GPU for the cost; default: read from GPU 0.
        number_of_gpus: GPUs per training run.
        max_tries: Trials per recurrence before giving up.
        timeout_s: Wall-clock limit of one training subprocess (None: no limit).
    """

    def __init__(
        self,
        batch_size_optimizer: BatchSizeOptimizerBackend | None,
        log_base: str | Path,
        monitor_path: str | None = None,
        seed: int = 123456,
        observer_mode: bool = False,
        profile_warmup_iters: int = 10,
        profile_measure_iters: int = 40,
        *,
        max_power_w: float | None = None,
        number_of_gpus: int = 1,
        max_tries: int = 20,
        timeout_s: float | None = None,
    ) -> None:
        if profile_warmup_iters < 0 or profile_measure_iters < 1:
            raise ZeusConfigError(
                f"profile_warmup_iters={profile_warmup_iters} must be >= 0 and "
                f"profile_measure_iters={profile_measure_iters} >= 1."
            )
        if number_of_gpus < 1 or max_tries < 1:
            raise ZeusConfigError(
                f"number_of_gpus={number_of_gpus} and max_tries={max_tries} must be >= 1."
            )
        self.bso: BatchSizeOptimizerBackend = (
            batch_size_optimizer if batch_size_optimizer is not None else LocalBatchSizeOptimizer()
        )
        self.log_base = Path(log_base)
        self.monitor_path = monitor_path
        self.seed = seed
        self.observer_mode = observer_mode
        self.profile_warmup_iters = profile_warmup_iters
        self.profile_measure_iters = profile_measure_iters
        self.number_of_gpus = number_of_gpus
        self.max_tries = max_tries
        self.timeout_s = timeout_s
        if max_power_w is None:
            from zeus_power.device import open_gpus

            max_power_w = open_gpus([0])[0].power_limit_constraints_mw()[1] / 1000.0
        if not max_power_w > 0:
            raise ZeusConfigError(f"max_power_w={max_power_w} must be > 0.")
        self.max_power_w = float(max_power_w)

    def build_logdir(
        self,
        job: Job,
        num_recurrence: int,
        eta_knob: float,
        beta_knob: float | None,
        exist_ok: bool = True,
    ) -> str:
        """Create and return the log directory of a `run`.

        Its name is `{job}+x{num_recurrence}+eta{eta}+beta{beta}+{YYYYmmddHHMMSS}`.
        """
        now = datetime.now().strftime("%Y%m%d%H%M%S")
        logdir = self.log_base / f"{job}+x{num_recurrence}+eta{eta_knob}+beta{beta_knob}+{now}"
        logdir.mkdir(parents=True, exist_ok=exist_ok)
        return str(logdir)

    def run_job(
        self,
        job: Job,
        batch_size: int,
        learning_rate: float,
        seed: int,
        logdir: str | Path,
        rec_i: int,
        tries: int,
        eta_knob: float,
        cost_ub: float,
    ) -> tuple[float, float, bool]:
        """Launch the training script once and return (energy J, time s, reached target).

        Raises:
            ZeusMasterError: The script exited without writing a valid result (its log
                is in `logdir`), or ran past `timeout_s`.
        """
        result = self._train_once(
            job, batch_size, learning_rate, seed, logdir, rec_i, tries, eta_knob, cost_ub
        )
        return result.energy_j, result.time_s, result.reached

    def _train_once(
        self,
        job: Job,
        batch_size: int,
        learning_rate: float,
        seed: int,
        logdir: str | Path,
        rec_i: int,
        tries: int,
        eta_knob: float,
        cost_ub: float,
    ) -> TrainingResult:
        """`run_job`, returning the script's whole `TrainingResult` (`emulated` included)."""
        check_eta_knob(eta_knob)
        logdir = Path(logdir)
        stem = f"rec{rec_i:02d}+try{tries:02d}"
        result_path = logdir / f"{stem}.result.json"
        log_path = logdir / f"{stem}.train.log"
        result_path.unlink(missing_ok=True)
        values: dict[str, object] = {
            "batch_size": batch_size,
            "learning_rate": learning_rate,
            "seed": seed,
            "max_epochs": job.max_epochs,
            "result_path": result_path,
            "log_dir": logdir,
        }
        env = dict(os.environ)
        env.update(
            {
                "ZEUS_JOB_ID": job.name,
                "ZEUS_BATCH_SIZE": str(batch_size),
                "ZEUS_LEARNING_RATE": repr(float(learning_rate)),
                "ZEUS_SEED": str(seed),
                "ZEUS_ETA_KNOB": repr(float(eta_knob)),
                "ZEUS_COST_THRESH": "inf" if math.isinf(cost_ub) else repr(float(cost_ub)),
                "ZEUS_MAX_POWER_W": repr(self.max_power_w * self.number_of_gpus),
                "ZEUS_TARGET_METRIC": repr(float(job.target_metric)),
                "ZEUS_HIGHER_IS_BETTER": "1" if job.higher_is_better_metric else "0",
                "ZEUS_MAX_EPOCHS": str(job.max_epochs),
                "ZEUS_LOG_DIR": str(logdir),
                "ZEUS_RESULT_PATH": str(result_path),
                "ZEUS_MONITOR_PATH": self.monitor_path or "",
                "ZEUS_PROFILE_PARAMS": f"{self.profile_warmup_iters},{self.profile_measure_iters}",
                "ZEUS_USE_OPTIMAL_PL": "0" if self.observer_mode else "1",
            }
        )
        argv = job.gen_command(values)
        logger.info("rec %d try %d: %s", rec_i, tries, " ".join(argv))
        with log_path.open("w") as log:
            try:
                proc = subprocess.run(
                    argv,
                    cwd=job.workdir,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=self.timeout_s,
                    check=False,
                )
            except subprocess.TimeoutExpired as exc:
                raise ZeusMasterError(
                    f"Training of job {job.name!r} ({stem}) ran past {self.timeout_s} s; "
                    f"see {log_path}."
                ) from exc
            except OSError as exc:
                raise ZeusMasterError(
                    f"Cannot launch {argv!r} for job {job.name!r}: {exc}"
                ) from exc
        if not result_path.exists():
            tail = log_path.read_text()[-2000:]
            raise ZeusMasterError(
                f"Training of job {job.name!r} ({stem}) exited with code {proc.returncode} "
                f"without writing {result_path}; log {log_path} ends with:\n{tail}"
            )
        try:
            result = TrainingResult.model_validate_json(result_path.read_text())
        except ValidationError as exc:
            raise ZeusMasterError(
                f"Training of job {job.name!r} ({stem}) wrote an invalid result "
                f"{result_path}: {exc}"
            ) from exc
        if proc.returncode != 0:
            logger.info("%s exited with code %d (result written)", stem, proc.returncode)
        return result

    def run(
        self,
        job: Job,
        num_recurrence: int,
        batch_sizes: Sequence[int],
        beta_knob: float | None,
        eta_knob: float,
    ) -> list[HistoryEntry]:
        """Run a job that recurs `num_recurrence` times, sequentially, without overlap.

        A recurrence ends when a trial reaches the target metric; a failed trial is
        retried (with the batch size the optimizer picks next) up to `max_tries` times.
        The history is also written as JSON lines to `<logdir>/history.jsonl`.
        """
        check_eta_knob(eta_knob)
        if num_recurrence < 1:
            raise ZeusConfigError(f"num_recurrence={num_recurrence} must be >= 1.")
        config = JobConfig(
            job_id=job.name,
            batch_sizes=list(batch_sizes),
            default_batch_size=job.default_batch_size,
            eta_knob=eta_knob,
            beta_knob=beta_knob,
            target_metric=job.target_metric,
            higher_is_better_metric=job.higher_is_better_metric,
            max_epochs=job.max_epochs,
            mab_seed=self.seed,
            max_power_w=self.max_power_w,
            number_of_gpus=self.number_of_gpus,
        )
        self.bso.register_job(config)
        logdir = Path(self.build_logdir(job, num_recurrence, eta_knob, beta_knob))
        rng = np.random.default_rng(self.seed)
        history: list[HistoryEntry] = []
        with (logdir / "history.jsonl").open("w") as history_file:
            for rec_i in range(1, num_recurrence + 1):
                for tries in range(1, self.max_tries + 1):
                    trial = self.bso.next_trial(job.name)
                    cost_ub = trial.cost_ub if trial.cost_ub is not None else math.inf
                    result = self._train_once(
                        job,
                        trial.batch_size,
                        job.scale_lr(trial.batch_size),
                        int(rng.integers(2**31)),
                        logdir,
                        rec_i,
                        tries,
                        eta_knob,
                        cost_ub,
                    )
                    energy_j, time_s, reached = result.energy_j, result.time_s, result.reached
                    record = self.bso.report(
                        job.name,
                        trial.trial_number,
                        TrialResult(energy_j=energy_j, time_s=time_s, converged=reached),
                    )
                    entry = HistoryEntry(
                        rec_i=rec_i,
                        try_i=tries,
                        batch_size=trial.batch_size,
                        energy_j=energy_j,
                        time_s=time_s,
                        reached=reached,
                        cost=record.cost if record.cost is not None else math.nan,
                        stage=trial.stage,
                        emulated=result.emulated,
                    )
                    history.append(entry)
                    history_file.write(json.dumps(asdict(entry)) + "\n")
                    history_file.flush()
                    if reached:
                        break
                else:
                    raise ZeusMasterError(
                        f"Recurrence {rec_i} of job {job.name!r} did not reach the target in "
                        f"{self.max_tries} tries; see {logdir}."
                    )
        return history
