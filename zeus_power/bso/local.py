"""An in-process batch-size optimizer: the server's policy over an in-memory trial list.

`ZeusMaster` and the simulator use it where a server would only add a round trip. It
makes the same decisions as the server (both call `zeus_power.bso.policy.decide`), but
it is not shared between processes.
"""

from __future__ import annotations

from zeus_power.bso.models import JobConfig, JobState, TrialAssignment, TrialRecord, TrialResult
from zeus_power.bso.policy import best_trial, decide, stage_of
from zeus_power.errors import ZeusBSOConflictError
from zeus_power.metric import zeus_cost

__all__ = ["LocalBatchSizeOptimizer"]


class LocalBatchSizeOptimizer:
    """Pruning + Gaussian Thompson sampling for one job, in memory."""

    def __init__(self, config: JobConfig) -> None:
        self.config = config
        self._trials: list[TrialRecord] = []

    @property
    def trials(self) -> list[TrialRecord]:
        """All trials so far, by trial number."""
        return list(self._trials)

    def state(self) -> JobState:
        """Where the exploration stands."""
        stage, survivors = stage_of(self.config, self._trials)
        best = best_trial(self._trials)
        return JobState(
            config=self.config,
            stage=stage,
            survivors=survivors,
            best_batch_size=best.batch_size if best else None,
            best_cost=best.cost if best else None,
            num_trials=len(self._trials),
        )

    def next_trial(self) -> TrialAssignment:
        """Decide the next batch size and record the trial as dispatched."""
        decision = decide(self.config, self._trials)
        number = len(self._trials) + 1
        self._trials.append(
            TrialRecord(
                job_id=self.config.job_id,
                trial_number=number,
                batch_size=decision.batch_size,
                stage=decision.stage,
                round=decision.round,
                status="dispatched",
            )
        )
        best = best_trial(self._trials)
        cost_ub = None
        if best is not None and best.cost is not None and self.config.beta_knob is not None:
            cost_ub = self.config.beta_knob * best.cost
        return TrialAssignment(
            job_id=self.config.job_id,
            trial_number=number,
            batch_size=decision.batch_size,
            stage=decision.stage,
            round=decision.round,
            cost_ub=cost_ub,
        )

    def report(self, trial_number: int, result: TrialResult) -> TrialRecord:
        """Record the result of a dispatched trial."""
        if not 1 <= trial_number <= len(self._trials):
            raise ZeusBSOConflictError(
                f"Job {self.config.job_id!r} has no trial {trial_number}; "
                f"valid numbers are 1..{len(self._trials)}."
            )
        old = self._trials[trial_number - 1]
        if old.status != "dispatched":
            raise ZeusBSOConflictError(
                f"Trial {trial_number} of job {self.config.job_id!r} was already reported."
            )
        record = old.model_copy(
            update={
                "status": "succeeded" if result.converged else "failed",
                "energy_j": result.energy_j,
                "time_s": result.time_s,
                "converged": result.converged,
                "epochs": result.epochs,
                "cost": zeus_cost(
                    result.energy_j,
                    result.time_s,
                    self.config.eta_knob,
                    self.config.total_max_power_w,
                ),
            }
        )
        self._trials[trial_number - 1] = record
        return record
