"""Zeus-style baselines: one SM frequency per job (`ZeusGlobal`) or per stage (`ZeusPerStage`).

Zeus (Zeus, NSDI'23) picks a GPU power limit by profiling each limit and minimising its
cost ``η·E + (1 − η)·MaxPower·T``. These baselines do the same with SM frequencies, so that
comparisons run in the same system: the frequency sweep of `perseus.schedulers.sweep.instruction_sweep` stands in
for Zeus's power-limit sweep (high → low; a sweep stops after `early_stop_after`
consecutive cost rises), then the minimum-cost frequency is deployed for good.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from typing import Literal

from pydantic import Field

from perseus.domain.kinds import DEFAULT_P2P_POWER_W
from perseus.errors import PlanError
from perseus.planning import make_plan
from perseus.protocol import JobInfo, RankInfo
from perseus.schedulers.args import PipelineArgs, SweepArgs
from perseus.schedulers.pipeline import RoundMeasurement
from perseus.schedulers.sweep.instruction_sweep import InstructionSweep
from perseus.schedulers.sweep_then_deploy import SweepThenDeploy
from perseus.settings import PerseusSettings
from zeus_power.metric import zeus_cost

__all__ = ["ZeusArgs", "ZeusGlobal", "ZeusPerStage"]

logger = logging.getLogger(__name__)


class ZeusArgs(PipelineArgs, SweepArgs):
    """The Zeus baselines' arguments: the pipeline, the sweep, and Zeus's cost."""

    eta_knob: float = Field(default=0.5, ge=0.0, le=1.0, description="energy vs time weight")
    max_power_w: float | None = Field(
        default=None, gt=0.0, description="per-GPU MaxPower, W (None: measured at all-max)"
    )
    sweep: Literal["full"] = Field(
        default="full",
        description="Zeus measures whole rounds (a stage or the job) at one clock per level: "
        "only the full sweep",
    )


class _ZeusFrequency(SweepThenDeploy):
    """Shared machinery; `per_stage` selects the variant."""

    Args = ZeusArgs
    per_stage = False

    def __init__(
        self,
        job_info: JobInfo,
        rank_infos: list[RankInfo],
        perseus_settings: PerseusSettings,
        args: ZeusArgs,
    ) -> None:
        super().__init__(job_info, rank_infos, perseus_settings, args)
        self.eta_knob = args.eta_knob
        self.max_power_per_gpu_w = args.max_power_w
        self._max_power: dict[Hashable, float] = {}
        ranks = self.pipeline.stage_ranks  # pipeline (virtual) stage → its pipeline rank
        self.sweep = InstructionSweep(
            self,
            args,
            group=(lambda stage, name: ranks[stage]) if self.per_stage else (lambda s, n: "all"),
            metric=self.cost,
        )

    def cost(self, group: Hashable, m: RoundMeasurement) -> float:
        """Zeus's cost of one round for a group (the job, or one pipeline rank: all the
        stages it holds)."""
        if self.per_stage:
            stage = m.stages[group]  # type: ignore[index]
            time_s, energy_j = stage.busy_s, stage.compute_energy_j
            gpus = self.job_info.tp_degree
        else:
            time_s, energy_j = m.iteration_time_s, m.job_energy_j
            gpus = self.job_info.world_size
        if group not in self._max_power:
            # MaxPower: the GPUs' power limit if given, else the average power of the first
            # (all-max, so highest-power) sweep round.
            self._max_power[group] = (
                self.max_power_per_gpu_w * gpus
                if self.max_power_per_gpu_w is not None
                else energy_j / time_s
            )
        return zeus_cost(energy_j, time_s, self.eta_knob, self._max_power[group])

    def _deploy(self) -> None:
        sweep = self.sweep
        if sweep is None:
            raise PlanError(f"Job {self.job_info.job_id}: no sweep to choose a frequency from")
        best = {g: min(hist, key=lambda fv: fv[1])[0] for g, hist in sweep.history.items()}
        if self.per_stage:
            stage_freqs = [best[s] for s in range(self.num_stages)]
        else:
            stage_freqs = [best["all"]] * self.num_stages
        profile = sweep.profile()
        measured = sweep.p2p_power_w()
        p2p = (DEFAULT_P2P_POWER_W if measured is None else measured) * self.job_info.tp_degree
        freqs = [[f] * len(kinds) for f, kinds in zip(stage_freqs, self.kinds, strict=True)]
        self.adopt(make_plan(profile, self.pipeline, freqs, p2p))
        logger.info(
            "Job %s: %s chose %s MHz (eta_knob %.2f)",
            self.job_info.job_id,
            type(self).__name__,
            stage_freqs,
            self.eta_knob,
        )

class ZeusGlobal(_ZeusFrequency):
    """One SM frequency for every GPU of the job, minimising Zeus's cost.

    Sweep round k runs all GPUs at levels[k]; the round's cost is
    ``η·E_job + (1 − η)·MaxPower·T`` with E_job the mean iteration energy summed over all
    GPUs, T the iteration time, MaxPower = `max_power_w` × world_size (default: the job's
    average power in the all-max round). The cheapest frequency is deployed.

    Args (``PERSEUS_SCHEDULER_ARGS``): `num_microbatches`, `schedule`, `eta_knob` (default
    0.5), `max_power_w` (per GPU), and the sweep's `warmup_rounds`, `freq_step`,
    `min_frequency`, `early_stop_after`.
    """

    per_stage = False


class ZeusPerStage(_ZeusFrequency):
    """`ZeusGlobal`'s choice made for each pipeline rank (a "stage": every pipeline stage
    it holds) independently.

    Each stage is costed as if it ran alone: T = its per-iteration computation time, E =
    its computation energy (tp GPUs of one pipeline), MaxPower = `max_power_w` × tp_degree
    (default: the stage's average power at max frequency). Each stage's sweep stops on its
    own, and each stage deploys its cheapest frequency. Ignoring the pipeline's
    dependencies is exactly what separates this baseline from Perseus.
    """

    per_stage = True
