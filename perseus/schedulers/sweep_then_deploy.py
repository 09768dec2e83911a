"""Sweep, then deploy: the round loop of every scheduler that measures before it plans.

`SweepThenDeploy` runs its `InstructionSweep`'s rounds while the sweep has any left, then
calls `_deploy` once, which chooses a plan and `adopt`s it; every later round runs that
plan. `EnvPipe`, the Zeus baselines and `PlanningScheduler` use the loop as it is;
`Perseus` adds all-max rounds before the sweep and its guard after the deployment, around
the same `_sweep_left` and `_deploy`.
"""

from __future__ import annotations

import abc

from perseus.domain.plan import Plan
from perseus.errors import PlanError
from perseus.protocol import ProfilingResult
from perseus.schedulers.base import RoundReport
from perseus.schedulers.measurement import RoundMeasurement, StagePlan
from perseus.schedulers.pipeline import PipelineScheduler
from perseus.schedulers.sweep.instruction_sweep import InstructionSweep

__all__ = ["SweepThenDeploy"]


class SweepThenDeploy(PipelineScheduler):
    """A pipeline scheduler that sweeps (`sweep`; None: nothing to measure), then deploys
    one plan (`_deploy`) and runs it from then on."""

    sweep: InstructionSweep | None = None
    chosen: Plan | None = None
    """The deployed plan (None until the scheduler has planned)."""
    _chosen_plan: StagePlan | None = None

    @abc.abstractmethod
    def _deploy(self) -> None:
        """Choose the plan from what the sweep measured, and `adopt` it."""

    def adopt(self, plan: Plan) -> None:
        """Deploy `plan` from now on (checked against this job's stages and kinds first)."""
        self._chosen_plan = self.check_plan(plan)
        self.chosen = plan

    def deployed_plan(self) -> Plan | None:
        """The plan chosen for the job (None until the scheduler has planned)."""
        return self.chosen

    def report(self) -> RoundReport:
        return RoundReport(plan=self.chosen)

    def resume(self, plan: Plan) -> None:
        """Resume at a persisted plan (restarted coordinator): no sweep."""
        self.adopt(plan)
        self.sweep = None

    def _sweep_left(self) -> bool:
        """Whether the sweep still has rounds to run."""
        return self.sweep is not None and not self.sweep.done

    def _deployed_plan(self) -> StagePlan:
        """The adopted plan's stage plan (`_deploy` must have adopted one)."""
        if self._chosen_plan is None:
            raise PlanError(f"Job {self.job_info.job_id}: {type(self).__name__} deployed no plan")
        return self._chosen_plan

    def plan_next(self) -> StagePlan:
        if self._chosen_plan is None:
            if self.sweep is not None and self._sweep_left():
                return self.sweep.current_plan()
            self._deploy()
        return self._deployed_plan()

    def on_measurement(
        self, measurement: RoundMeasurement | None, results: list[ProfilingResult]
    ) -> None:
        if self._chosen_plan is None and self.sweep is not None:
            self.sweep.observe(measurement)

    def round_steps(self) -> int | None:
        """While the sweep runs, rounds long enough for its energy windows."""
        return None if self.sweep is None else self.sweep.round_steps()
