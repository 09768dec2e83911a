"""The costs a cluster charges that the instruction profile does not hold, measured online.

- **Clock switches.** Each rank times its own GPU applying a locked clock
  (`perseus.client.gpu.frequency.measure_switch_latency`) and registers the figure
  (`RankInfo.switch_latency_s`); the plan counts the slowest rank's (`switch_latency_s`).
- **P2P hops and host gaps.** Whatever a rank waits for between two instructions beyond what
  the DAG knows (a send/recv through NCCL or gloo, a process waking up) is charged to the
  edges between pipeline ranks: `calibrate_costs` finds the hop latency at which the model's
  all-max iteration time equals the job's measured one (median of its all-max rounds), then
  checks the model so calibrated against every other round whose plan it knows (the
  profiling sweep's), and reports how far the two disagree (`CostModel.residual`).
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from perseus.domain.plan import Plan
from perseus.domain.profile import InstructionProfile
from perseus.domain.schedule import PipelineSchedule
from perseus.errors import PerseusError
from perseus.protocol import RankInfo

__all__ = [
    "CostModel",
    "calibrate_costs",
    "job_switch_latency",
    "measured_switch_latency_s",
    "rescore_faster",
]

logger = logging.getLogger(__name__)


def measured_switch_latency_s(rank_infos: Sequence[RankInfo]) -> float | None:
    """The slowest clock switch the job's ranks measured (None: no rank measured one)."""
    measured = [r.switch_latency_s for r in rank_infos if r.switch_latency_s is not None]
    return max(measured) if measured else None


def job_switch_latency(given_ms: float | None, rank_infos: Sequence[RankInfo]) -> tuple[float, str]:
    """The clock-switch latency (s) to plan with, and where it comes from: `given_ms`
    ("given"), else the slowest the ranks measured ("measured"), else 0 ("unknown")."""
    if given_ms is not None:
        return given_ms / 1000.0, "given"
    measured = measured_switch_latency_s(rank_infos)
    return (0.0, "unknown") if measured is None else (measured, "measured")


@dataclass(frozen=True)
class CostModel:
    """What the plan counts beyond the profile, and how well it explains the measurements."""

    switch_latency_s: float
    """Time a clock change takes to apply."""
    switch_source: str
    """"measured", "given" or "unknown" (then 0)."""
    hop_latency_s: float
    """Time added to every edge between two pipeline ranks."""
    hop_source: str
    """"calibrated", "given" or "none" (no all-max measurement yet)."""
    residual: float | None = None
    """Median relative error of the model's iteration time over the rounds it was checked
    on (None: no round to check)."""
    checked_rounds: int = 0

    def describe(self) -> str:
        parts = [
            f"clock switch {self.switch_latency_s * 1000:.1f} ms ({self.switch_source})",
            f"P2P hop {self.hop_latency_s * 1000:.2f} ms ({self.hop_source})",
        ]
        if self.residual is not None:
            parts.append(
                f"explains {self.checked_rounds} profiling round(s) within "
                f"{self.residual:.2%} (median)"
            )
        return ", ".join(parts)


def calibrate_costs(
    profile: InstructionProfile,
    schedule: PipelineSchedule,
    p2p_power_w: float,
    *,
    switch_latency_s: float,
    switch_source: str,
    hop_latency_s: float | None,
    baseline_time_s: float | None,
    rounds: Sequence[tuple[list[list[int]], float]] = (),
) -> CostModel:
    """The cost model for a job.

    Args:
        switch_latency_s, switch_source: The clock-switch latency and where it came from.
        hop_latency_s: A given hop latency (None: calibrate it).
        baseline_time_s: The measured all-max iteration time (median of the all-max rounds).
        rounds: (per-stage frequencies, measured iteration time) of other rounds, to check
            the calibrated model against.
    """
    from perseus.planning import calibrate_hop_latency, evaluate, max_frequencies, pipeline_problem

    if hop_latency_s is not None:
        hop, source = hop_latency_s, "given"
    elif baseline_time_s is None:
        hop, source = 0.0, "none"
    else:
        pp = pipeline_problem(profile, schedule, p2p_power_w)
        # The all-max plan changes no clock: its time needs no switching model.
        hop = calibrate_hop_latency(pp, max_frequencies(profile, schedule), baseline_time_s)
        source = "calibrated"
    errors: list[float] = []
    for freqs, measured_s in rounds:
        try:
            modelled = evaluate(
                profile,
                schedule,
                freqs,
                p2p_power_w,
                switch_latency_s=switch_latency_s,
                hop_latency_s=hop,
            ).iteration_time_s
        except PerseusError:  # a round that ran a clock the profile lacks
            continue
        if measured_s > 0 and math.isfinite(modelled):
            errors.append(abs(modelled / measured_s - 1.0))
    return CostModel(
        switch_latency_s=switch_latency_s,
        switch_source=switch_source,
        hop_latency_s=hop,
        hop_source=source,
        residual=statistics.median(errors) if errors else None,
        checked_rounds=len(errors),
    )


def rescore_faster(
    profile: InstructionProfile,
    schedule: PipelineSchedule,
    p2p_power_w: float,
    costs: CostModel,
    *,
    chosen: Plan,
    candidates: Sequence[list[list[int]]],
    measured_time_s: float,
    limit_s: float,
    max_slowdown: float | None = None,
) -> tuple[Plan | None, CostModel]:
    """The cheapest of `candidates` faster than `chosen` that meets `limit_s` under the
    costs re-measured on `chosen` (None when none does), and those costs.

    `chosen` ran slower than its model said (`measured_time_s`): the hop latency is
    re-calibrated so that the model gives `chosen` its measured time (never below the
    latency it was planned with), and every candidate is re-scored with it. With
    `max_slowdown`, a candidate must also be within it of the all-max plan scored with the
    same costs: the slowdown the job's report predicts for it never exceeds the budget,
    even where the measured all-max rounds (`limit_s`) ran slower than the model's all-max.

    A candidate that saves nothing against all-max under those costs (the frontier's
    fastest point is all-max's clocks) is no move: where it is the only one left, None, and
    the guard falls back, with the fall-back's cool-down and re-deployment, instead of
    keeping all-max as a deployed plan for good.
    """
    from perseus.planning import all_max_plan, calibrate_hop_latency, make_plan, pipeline_problem

    pp = pipeline_problem(profile, schedule, p2p_power_w)
    hop = calibrate_hop_latency(
        pp,
        chosen.stage_frequencies(),
        measured_time_s,
        switch_latency_s=costs.switch_latency_s,
    )
    new = replace(
        costs,
        hop_latency_s=max(hop, costs.hop_latency_s),
        hop_source="re-calibrated on the deployed plan",
    )

    def scored(freqs: list[list[int]]) -> Plan:
        return make_plan(
            profile,
            schedule,
            freqs,
            p2p_power_w,
            switch_latency_s=new.switch_latency_s,
            hop_latency_s=new.hop_latency_s,
        )

    now_s = scored(chosen.stage_frequencies()).iteration_time
    all_max = all_max_plan(
        profile,
        schedule,
        p2p_power_w,
        switch_latency_s=new.switch_latency_s,
        hop_latency_s=new.hop_latency_s,
    )
    if max_slowdown is not None:
        limit_s = min(limit_s, (1.0 + max_slowdown) * all_max.iteration_time)
    best: Plan | None = None
    for freqs in candidates:
        plan = scored(freqs)
        if plan.iteration_time >= now_s or plan.iteration_time > limit_s:
            continue  # only plans faster than the one that broke its budget, within it
        if plan.energy >= all_max.energy:
            continue  # saves nothing: all-max itself, which the guard reaches by falling back
        if best is None or plan.energy < best.energy:
            best = plan
    return best, (new if best is not None else costs)
