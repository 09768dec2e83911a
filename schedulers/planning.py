"""Shared by the schedulers that plan from a profile (`Perseus`, `EnvPipe`).

Their profile and the GPUs' blocking (P2P) power come from scheduler arguments when
given (`profile_path`, `p2p_power`), or else from an online `InstructionSweep`: the sweep
writes `instruction_profile.csv` and measures the blocking power from its all-max rounds.
"""

from __future__ import annotations

import logging

from perseus.domain.kinds import DEFAULT_P2P_POWER_W
from perseus.domain.plan import Plan
from perseus.domain.profile import InstructionProfile
from perseus.io.profile_csv import load_profile
from schedulers.args import PipelineArgs, ProfileSourceArgs
from schedulers.pipeline import PipelineScheduler, StagePlan
from schedulers.sweep import InstructionSweep

__all__ = ["DEFAULT_P2P_POWER_W", "PlanningArgs", "PlanningScheduler"]

logger = logging.getLogger(__name__)


class PlanningArgs(PipelineArgs, ProfileSourceArgs):
    """A planning scheduler's arguments: the pipeline, a given profile / blocking power, and
    the sweep that measures what is not given."""


class PlanningScheduler(PipelineScheduler):
    """A pipeline scheduler that needs a profile and the blocking power before it plans."""

    Args = PlanningArgs

    profile: InstructionProfile | None
    p2p_power_w: float | None
    sweep: InstructionSweep | None
    chosen: Plan | None = None
    """The deployed plan (None until the scheduler has planned)."""
    _chosen_plan: StagePlan | None = None
    _baseline: tuple[InstructionProfile, float, Plan] | None = None

    def adopt(self, plan: Plan) -> None:
        """Deploy `plan` from now on (checked against this job's stages and kinds first)."""
        self._chosen_plan = self.check_plan(plan)
        self.chosen = plan

    def deployed_plan(self) -> Plan | None:
        return self.chosen

    def baseline_plan(self) -> Plan | None:
        """The all-max plan on this job's profile and blocking power (None before both are
        known); computed once."""
        profile, p2p = getattr(self, "profile", None), getattr(self, "p2p_power_w", None)
        if profile is None or p2p is None:
            return None
        cached = self._baseline
        if cached is None or cached[0] is not profile or cached[1] != p2p:
            from perseus.planning import make_plan, max_frequencies

            plan = make_plan(profile, self.pipeline, max_frequencies(profile, self.pipeline), p2p)
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
        assert self.profile is not None and self.p2p_power_w is not None
        return self.profile, self.p2p_power_w
