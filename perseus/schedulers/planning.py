"""Shared by the schedulers that plan from a profile (`Perseus`, `EnvPipe`).

Their profile and the GPUs' blocking (P2P) power come from scheduler arguments when
given (`profile_path`, `p2p_power`), or else from an online `InstructionSweep`: the sweep
writes `instruction_profile.csv` and measures the blocking power from its all-max rounds.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

from perseus.domain.kinds import DEFAULT_P2P_POWER_W
from perseus.domain.plan import Plan
from perseus.domain.profile import InstructionProfile
from perseus.errors import PlanError
from perseus.io.atomic import atomic_write_text
from perseus.io.profile_csv import load_profile
from perseus.schedulers.args import PipelineArgs, ProfileSourceArgs
from perseus.schedulers.base import RoundReport
from perseus.schedulers.sweep.instruction_sweep import InstructionSweep
from perseus.schedulers.sweep_then_deploy import SweepThenDeploy

__all__ = ["DEFAULT_P2P_POWER_W", "PlanningArgs", "PlanningScheduler"]

logger = logging.getLogger(__name__)


class PlanningArgs(PipelineArgs, ProfileSourceArgs):
    """A planning scheduler's arguments: the pipeline, a given profile / blocking power, and
    the sweep that measures what is not given."""


class PlanningScheduler(SweepThenDeploy):
    """A scheduler that needs a profile and the blocking power before it plans: given, or
    measured by its sweep first (`SweepThenDeploy`)."""

    Args = PlanningArgs

    profile: InstructionProfile | None
    p2p_power_w: float | None
    _baseline: tuple[InstructionProfile, float, Plan] | None = None

    def report_profiling(self, plan: Plan | None) -> None:
        """Log what the sweep cost and write it to ``profiling.json`` (with `plan`: the
        plan chosen, what running it instead would have cost)."""
        if self.sweep is None:
            return
        if plan is None:
            report = self.sweep.report()
        else:
            job_j = plan.energy * self.job_info.dp_degree  # a plan's energy is one pipeline's
            report = self.sweep.report(plan.iteration_time, job_j)
        report |= self.profiling_extras()
        atomic_write_text(self.job_dir.profiling, json.dumps(report, indent=2) + "\n")
        logger.info(
            "Job %s: profiling took %d round(s), %d iteration(s), %.1f s, %.1f kJ; the chosen "
            "plan would have taken %+.1f s and %+.2f kJ less (%s)",
            self.job_info.job_id,
            report["rounds"],
            report["iterations"],
            report["seconds"],
            report["energy_j"] / 1000,
            report.get("off_plan_seconds") or 0.0,
            (report.get("off_plan_energy_j") or 0.0) / 1000,
            self.job_dir.profiling,
        )

    def profiling_extras(self) -> dict[str, Any]:
        """More for ``profiling.json`` (`Perseus`: the kind of plan); default nothing."""
        return {}

    def report(self) -> RoundReport:
        """The deployed plan and the all-max plan scored like it (None until the profile and
        the blocking power are known; a baseline that cannot be scored is left out, saying
        so: the energy report's baseline must never fail a round)."""
        try:
            baseline = self.baseline_plan()
        except Exception as exc:
            logger.warning("Job %s: no predicted all-max baseline: %s", self.job_info.job_id, exc)
            baseline = None
        return dataclasses.replace(super().report(), baseline=baseline)

    def baseline_plan(self) -> Plan | None:
        """The all-max plan on this job's profile and blocking power (None before both are
        known); computed once."""
        profile, p2p = getattr(self, "profile", None), getattr(self, "p2p_power_w", None)
        if profile is None or p2p is None:
            return None
        cached = self._baseline
        if cached is None or cached[0] is not profile or cached[1] != p2p:
            from perseus.planning import all_max_plan

            plan = all_max_plan(profile, self.pipeline, p2p)
            self._baseline = cached = (profile, p2p, plan)
        return cached[2]

    def init_profile_source(self, args: ProfileSourceArgs) -> None:
        """Use the given profile / blocking power, and sweep online for what is missing."""
        self.p2p_power_w = args.p2p_power
        self.profile = None
        if args.profile_path is not None:
            self.profile = load_profile(
                args.profile_path, check_power=not args.allow_implausible_power
            )
            self.pipeline.check_profile(self.profile)
        self.sweep = None
        if self.profile is None or self.p2p_power_w is None:
            if self.profile is not None:
                # With a given profile, only the blocking power is measured (one max step).
                args = args.model_copy(update={"min_frequency": self.max_freq_mhz})
            self.sweep = InstructionSweep(self, args)

    def complete_profile(self) -> tuple[InstructionProfile, float]:
        """After the sweep: the profile (written to the job folder) and the stage's blocking power."""
        if self.sweep is not None:
            measured = self.sweep.p2p_power_w()
            if self.profile is None:
                self.sweep.write_csv(self.job_dir.profile)
                self.profile = self.sweep.profile()
                estimates = self.profile.estimates()
                if estimates is not None:
                    n, total, median, worst = estimates
                    logger.info(
                        "Job %s: %d of %d profile options estimated from the energy counter's "
                        "refreshes (%s): standard error median %.2f %%, worst %.2f %% of the "
                        "energy",
                        self.job_info.job_id,
                        n,
                        total,
                        self.sweep.regression.model() or "no fit",
                        100 * median,
                        100 * worst,
                    )
            if self.p2p_power_w is None:
                if measured is None:
                    logger.warning(
                        "Job %s: blocking power could not be measured (no idle time); using %.2f W",
                        self.job_info.job_id,
                        DEFAULT_P2P_POWER_W,
                    )
                    measured = DEFAULT_P2P_POWER_W
                # A stage is tp GPUs, all blocked at once.
                self.p2p_power_w = measured * self.job_info.tp_degree
        return self.planning_inputs()

    def planning_inputs(self) -> tuple[InstructionProfile, float]:
        """The profile and the blocking power (`PlanError` before profiling is complete)."""
        if self.profile is None or self.p2p_power_w is None:
            raise PlanError(
                f"Job {self.job_info.job_id}: no profile or blocking power yet to plan with"
            )
        return self.profile, self.p2p_power_w
