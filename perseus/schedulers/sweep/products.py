"""What the sweep produces: the profile it measured and what measuring it cost."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from perseus.domain.kinds import INSTRUCTIONS
from perseus.domain.rows import ProfileRow
from perseus.schedulers.measurement import RoundMeasurement
from perseus.schedulers.pipeline import PipelineScheduler
from perseus.schedulers.sweep.option_estimates import SweepEstimates

__all__ = ["ProfilingCost", "profile_rows", "profiling_report"]

Options = dict[tuple[int, str], dict[int, float]]
"""Per (pipeline stage, kind), per clock (MHz), a time (s) or an energy (J)."""


@dataclass
class ProfilingCost:
    """What the profiling rounds cost: how many, their iterations, seconds and joules (all
    GPUs of the job, measured)."""

    rounds: int = 0
    iterations: int = 0
    seconds: float = 0.0
    energy_j: float = 0.0

    def add(self, m: RoundMeasurement) -> None:
        self.rounds += 1
        self.iterations += m.iterations
        self.seconds += m.iteration_time_s * m.iterations
        self.energy_j += m.job_energy_j * m.iterations


def profile_rows(
    scheduler: PipelineScheduler,
    units: list[tuple[int, str]],
    time_s: Options,
    energy_j: Options,
) -> list[ProfileRow]:
    """The profile's rows: per pipeline (virtual) stage, every kind the stage runs, clocks
    descending (rank = the first rank of the pipeline rank that holds it).

    Rows as fitted, not validated: a fit may give an option an energy no GPU can produce
    (below zero, even); `SweepEstimates.annotate` says which and leaves it out, so the
    rows are not passed through the wire model, which would refuse them."""
    pipeline = scheduler.pipeline
    rows: list[ProfileRow] = []
    for stage in sorted({s for s, _ in units}):
        pp = pipeline.stage_ranks[stage]
        first = min(scheduler.stage_ranks[pp], key=lambda r: (r.dp_rank, r.tp_rank))
        emulated = any(r.emulated for r in scheduler.stage_ranks[pp])
        for name in INSTRUCTIONS:
            if (stage, name) not in units:
                continue
            times = time_s.get((stage, name), {})
            energies = energy_j.get((stage, name), {})
            for freq in sorted(times, reverse=True):
                if freq not in energies:
                    continue
                rows.append(
                    ProfileRow(
                        first.rank,
                        first.dp_rank,
                        pp,
                        first.tp_rank,
                        stage,
                        name,
                        freq,
                        times[freq],
                        energies[freq],
                        emulated,
                    )
                )
    return rows


def profiling_report(
    cost: ProfilingCost,
    estimates: SweepEstimates,
    energy_j: Options,
    *,
    round_ticks: int,
    confirmed_options: int,
    plan_time_s: float | None = None,
    plan_energy_j: float | None = None,
) -> dict[str, Any]:
    """What the profile cost and how sure it is, for the log and ``profiling.json``.

    `plan_time_s`, `plan_energy_j`: the deployed plan's iteration (energy of all the
    job's GPUs): the profiling rounds' excess over running it instead ("off plan")."""
    windows = estimates.windows
    out: dict[str, object] = {
        "rounds": cost.rounds,
        "iterations": cost.iterations,
        "seconds": cost.seconds,
        "energy_j": cost.energy_j,
        "estimator": "windows" if windows else "breakdown",
        "refresh_s": estimates.refresh_s if windows else None,
        "round_ticks": round_ticks if windows else None,
        "confirmed_options": confirmed_options,
    }
    if plan_time_s is not None and plan_energy_j is not None:
        out["off_plan_seconds"] = cost.seconds - plan_time_s * cost.iterations
        out["off_plan_energy_j"] = cost.energy_j - plan_energy_j * cost.iterations
    out |= estimates.report(energy_j)
    return {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()
    }
