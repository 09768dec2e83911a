"""An in-process batch-size optimizer: the server's policy over in-memory trial lists.

`LocalBatchSizeOptimizer` has the same methods as the server's `BSOService`
(`register_job`, `get_job`, `list_trials`, `next_trial`, `report`) and makes the same
decisions (both call `zeus_power.bso.policy.decide`), so `ZeusMaster` and the simulator
can use either. It is not shared between processes; use the server for that.
"""

from __future__ import annotations

import threading

from zeus_power.bso.models import JobConfig, JobState, TrialAssignment, TrialRecord, TrialResult
from zeus_power.bso.policy import best_trial, decide, job_state
from zeus_power.errors import ZeusBSOConfigError, ZeusBSOConflictError, ZeusBSOJobNotFoundError
from zeus_power.metric import zeus_cost

__all__ = ["LocalBatchSizeOptimizer"]


class LocalBatchSizeOptimizer:
    """Pruning + Gaussian Thompson sampling for any number of jobs, in memory."""

    def __init__(self) -> None:
        self._configs: dict[str, JobConfig] = {}
        self._trials: dict[str, list[TrialRecord]] = {}
        self._lock = threading.Lock()

    def register_job(self, config: JobConfig) -> tuple[JobState, bool]:
        """Register `config` (or check it against the registered one); see `BSOService`."""
        with self._lock:
            registered = self._configs.get(config.job_id)
            if registered is None:
                self._configs[config.job_id] = config
                self._trials[config.job_id] = []
                return self._state(config.job_id), True
            if registered != config:
                raise ZeusBSOConfigError(
                    f"Job {config.job_id!r} is registered with a different config; use the "
                    "registered config or a new job_id."
                )
            return self._state(config.job_id), False

    def get_job(self, job_id: str) -> JobState:
        """The job's config and exploration state."""
        with self._lock:
            return self._state(job_id)

    def list_trials(self, job_id: str) -> list[TrialRecord]:
        """All trials of the job, by trial number."""
        with self._lock:
            self._require(job_id)
            return list(self._trials[job_id])

    def next_trial(self, job_id: str) -> TrialAssignment:
        """Decide the next batch size and record the trial as dispatched."""
        with self._lock:
            config = self._require(job_id)
            trials = self._trials[job_id]
            decision = decide(config, trials)
            best = best_trial(trials)
            number = len(trials) + 1
            trials.append(
                TrialRecord(
                    job_id=job_id,
                    trial_number=number,
                    batch_size=decision.batch_size,
                    stage=decision.stage,
                    round=decision.round,
                    status="dispatched",
                )
            )
            cost_ub = None
            if best is not None and best.cost is not None and config.beta_knob is not None:
                cost_ub = config.beta_knob * best.cost
            return TrialAssignment(
                job_id=job_id,
                trial_number=number,
                batch_size=decision.batch_size,
                stage=decision.stage,
                round=decision.round,
                cost_ub=cost_ub,
            )

    def report(self, job_id: str, trial_number: int, result: TrialResult) -> TrialRecord:
        """Record the result of a dispatched trial."""
        with self._lock:
            config = self._require(job_id)
            trials = self._trials[job_id]
            if not 1 <= trial_number <= len(trials):
                raise ZeusBSOConflictError(
                    f"Job {job_id!r} has no trial {trial_number}; valid: 1..{len(trials)}."
                )
            old = trials[trial_number - 1]
            if old.status != "dispatched":
                raise ZeusBSOConflictError(
                    f"Trial {trial_number} of job {job_id!r} was already reported "
                    f"({old.status}); a trial is reported once."
                )
            record = old.model_copy(
                update={
                    "status": "succeeded" if result.converged else "failed",
                    "energy_j": result.energy_j,
                    "time_s": result.time_s,
                    "converged": result.converged,
                    "epochs": result.epochs,
                    "cost": zeus_cost(
                        result.energy_j, result.time_s, config.eta_knob, config.total_max_power_w
                    ),
                }
            )
            trials[trial_number - 1] = record
            return record

    def _require(self, job_id: str) -> JobConfig:
        config = self._configs.get(job_id)
        if config is None:
            raise ZeusBSOJobNotFoundError(job_id)
        return config

    def _state(self, job_id: str) -> JobState:
        return job_state(self._require(job_id), self._trials[job_id])
