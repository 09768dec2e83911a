"""`EnvPipe` (Choi et al., USENIX ATC'23), the frequency-planning part, as a baseline."""

from __future__ import annotations

import logging

import numpy as np

from perseus.domain.profile import InstructionProfile
from perseus.domain.schedule import PipelineSchedule
from perseus.errors import PlanError
from perseus.planning import all_max_plan, make_plan, pipeline_problem
from perseus.protocol import JobInfo, RankInfo
from perseus.schedulers.planning import PlanningArgs, PlanningScheduler
from perseus.settings import PerseusSettings

__all__ = ["EnvPipe", "envpipe_frequencies"]

logger = logging.getLogger(__name__)


def envpipe_frequencies(
    profile: InstructionProfile, schedule: PipelineSchedule, p2p_power_w: float
) -> list[list[int]]:
    """EnvPipe's plan: slow down instructions in pipeline bubbles, never the iteration.

    The critical pipeline rank — the one with the most computation at max frequency (the
    last on ties), all the stages it holds — stays at max frequency. Every other instruction, greedily in order of
    decreasing slack, gets the option with the lowest ``e − P_block·t`` (the change in the
    pipeline's energy when its time changes but T does not) among those that fit in its
    current total float (latest finish − earliest finish), so the all-max iteration time
    never grows. Passes repeat until nothing changes. (EnvPipe also reorders forward
    passes; this baseline keeps the schedule's order, the same DAG every scheduler uses.)
    """
    pipeline = pipeline_problem(profile, schedule, p2p_power_w)
    problem = pipeline.solver  # the DAG and options, in the schedule's topological order
    instrs = pipeline.instructions
    options = [problem.type_options[t] for t in problem.type_of]
    choice = problem.reference_choice()  # every instruction at its maximum frequency
    dur = problem.choices_to_arrays(choice)[0]
    busy = [0.0] * schedule.num_stages
    for instr, d in zip(instrs, dur.tolist(), strict=True):
        busy[instr.rank] += d
    critical = max(range(schedule.num_stages), key=lambda s: (busy[s], s))
    n = len(instrs)

    def float_of() -> tuple[np.ndarray, float]:
        """Total float (latest finish − earliest finish) of every instruction, and T."""
        finish = problem.finish_times(dur)
        makespan = float(finish.max())
        latest_finish = problem.latest_start_finish(dur, makespan)[1]
        return latest_finish - finish, makespan

    slack, t0 = float_of()
    eps = 1e-12 * max(t0, 1.0)
    candidates = [i for i in range(n) if instrs[i].rank != critical]
    changed = True
    while changed:
        changed = False
        for i in sorted(candidates, key=lambda i: -slack[i]):
            if slack[i] <= eps:
                continue
            o = options[i]
            room = dur[i] + slack[i] + eps
            cost = o.energy_j - p2p_power_w * o.time_s
            ok = np.flatnonzero(o.time_s <= room)
            best = int(ok[np.argmin(cost[ok])])
            if cost[best] < cost[choice[i]] - 1e-12:
                choice[i] = best
                dur[i] = float(o.time_s[best])
                changed = True
                slack, _ = float_of()
    return pipeline.frequencies_of(choice)


class EnvPipe(PlanningScheduler):
    """Profile like `InstructionProfiler`, then deploy `envpipe_frequencies`' plan.

    The iteration time stays that of all-max (checked against `perseus.planning.all_max_plan`).

    Args (``PERSEUS_SCHEDULER_ARGS``): `num_microbatches`, `schedule`, `p2p_power` (W;
    default measured like `Perseus`), `profile_path` (skip the sweep), and the sweep's
    `warmup_rounds`, `freq_step`, `min_frequency`, `early_stop_after`.
    """

    Args = PlanningArgs

    def __init__(
        self,
        job_info: JobInfo,
        rank_infos: list[RankInfo],
        perseus_settings: PerseusSettings,
        args: PlanningArgs,
    ) -> None:
        super().__init__(job_info, rank_infos, perseus_settings, args)
        self.init_profile_source(args)
        if self.sweep is None:
            self._deploy()

    def _deploy(self) -> None:
        profile, p2p = self.complete_profile()
        freqs = envpipe_frequencies(profile, self.pipeline, p2p)
        plan = make_plan(profile, self.pipeline, freqs, p2p)
        fastest = all_max_plan(profile, self.pipeline, p2p)
        if plan.iteration_time > fastest.iteration_time * (1 + 1e-9):
            raise PlanError(
                f"Job {self.job_info.job_id}: EnvPipe's plan takes {plan.iteration_time:.6f} s, "
                f"longer than all-max's {fastest.iteration_time:.6f} s; it must never slow the "
                "iteration"
            )
        self.adopt(plan)
        logger.info(
            "Job %s: EnvPipe plan T=%.4f s, E=%.1f J (all-max E=%.1f J)",
            self.job_info.job_id,
            plan.iteration_time,
            plan.energy,
            fastest.energy,
        )
