"""A job's energy report: what it measured per iteration under the all-max baseline and
under its deployed plan, beside what the plan predicted.

One accounting, shared by the coordinator (``GET /jobs/{job_id}``, ``/metrics``) and
``perseus report`` (which reads a job's dump):

- A round's **measurement** (`IterationFigures`) is per iteration: its time is the slowest
  rank's median iteration time (`perseus.domain.robust.rank_time`: one iteration the host
  stalled does not move it), its energy the sum over every rank (every GPU of the job) of
  that rank's mean iteration energy. The promise guard judges the same figures. A leader's result (protocol 2) already holds its
  group's slowest time and summed energy per iteration, so the same sums over leaders
  give the same figures.
- A round is **all-max** when every rank ran every instruction at the highest frequency it
  registered, **deployed** when every rank ran its pipeline rank's list of the deployed plan,
  and **other** otherwise (profiling sweeps, straggler overrides).
- **Predicted** figures are the plan's (one pipeline) times the data-parallel degree; the
  predicted baseline is the all-max plan scored on the same profile.
- **Measured** figures are medians over rounds (`median_of_rounds`, the statistic of
  `perseus.domain.robust` the guard uses too): the all-max figures over the newest
  `REPORT_WINDOW` all-max rounds but the job's first (a warm-up), the deployed figures over
  the newest rounds of the plan deployed now (a plan replaced by the guard no longer counts). When the plan
  deployed now is all-max itself (the guard fell back, or a check kept all-max), the
  deployed figures are the all-max ones: nothing is saved.
- **Saving** is ``1 − E(deployed) / E(all-max)``; **slowdown** ``T(deployed) / T(all-max) − 1``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence

from pydantic import BaseModel, Field

from perseus.domain.plan import Plan
from perseus.domain.robust import ROUND_WINDOW, rank_time, window_medians
from perseus.protocol import FrequencySchedule, ProfilingResult

__all__ = [
    "EnergyReport",
    "IterationFigures",
    "IterationMeter",
    "RoundKind",
    "predicted_figures",
    "measure",
    "REPORT_WINDOW",
    "median_of_rounds",
    "round_kind",
]


class RoundKind(str, enum.Enum):
    """What a round's schedules ran (see the module docstring)."""

    ALL_MAX = "all-max"
    DEPLOYED = "deployed"
    OTHER = "other"


class IterationFigures(BaseModel):
    """Time and energy of one iteration of the whole job."""

    iteration_time_s: float = Field(description="per iteration, s")
    energy_j: float = Field(description="per iteration, all GPUs of the job, J")


def _mean(values: list[float]) -> float | None:
    if not values:
        return None
    m = math.fsum(values) / len(values)
    return m if math.isfinite(m) else None


class IterationMeter:
    """Accumulates one round's `ProfilingResult`s, one rank at a time (O(1) per result)."""

    def __init__(self) -> None:
        self.ranks = 0
        self._time_s = 0.0
        self._energy_j = 0.0

    def add(self, result: ProfilingResult) -> None:
        t, e = rank_time(result.iter_time), _mean(result.iter_energy)
        if t is None or e is None:
            return
        self.ranks += 1
        self._time_s = max(self._time_s, t)
        self._energy_j += e

    def figures(self) -> IterationFigures | None:
        if self.ranks == 0:
            return None
        return IterationFigures(iteration_time_s=self._time_s, energy_j=self._energy_j)


def measure(results: Iterable[ProfilingResult]) -> IterationFigures | None:
    """One round's figures (None when no rank reported a usable iteration)."""
    meter = IterationMeter()
    for r in results:
        meter.add(r)
    return meter.figures()


def round_kind(
    schedules: Iterable[FrequencySchedule],
    *,
    max_freq: Mapping[int, int],
    pp_rank: Mapping[int, int],
    plan: Plan | None,
) -> RoundKind:
    """Classify one round's schedules (rank → its max frequency and its pipeline rank).

    A leader's schedule (protocol 2) counts with every list it hands out to its group."""
    all_max = True
    deployed = plan is not None
    stage_freqs = plan.stage_frequencies() if plan is not None else []
    for s in schedules:
        for listed in s.lists():
            freqs = [f for _, f in listed]
            if all_max and any(f != max_freq.get(s.rank) for f in freqs):
                all_max = False
            if deployed:
                p = pp_rank.get(s.rank)
                deployed = p is not None and p < len(stage_freqs) and freqs == stage_freqs[p]
            if not (all_max or deployed):
                return RoundKind.OTHER
    return RoundKind.ALL_MAX if all_max else RoundKind.DEPLOYED


REPORT_WINDOW = ROUND_WINDOW
"""Measured rounds of each kind a report's medians take: the newest, so that the coordinator
(which keeps them) and a dump (which never prunes them) report the same figures, and the
guard's all-max window (`perseus.domain.robust.ROUND_WINDOW`)."""


def median_of_rounds(
    rounds: Sequence[tuple[int, RoundKind, IterationFigures]], *, plan_is_all_max: bool = False
) -> tuple[IterationFigures | None, IterationFigures | None]:
    """(all-max, deployed) medians of measured rounds (number, kind, figures): of each kind
    the newest `REPORT_WINDOW`; see the module docstring for which rounds count."""

    def median(kind: RoundKind) -> IterationFigures | None:
        picked = [
            f
            for n, k, f in sorted(rounds, key=lambda r: r[0])
            if k is kind and (n > 0 or kind is not RoundKind.ALL_MAX)
        ]
        if not picked:
            return None
        t, e = window_medians(
            [f.iteration_time_s for f in picked], [f.energy_j for f in picked], window=REPORT_WINDOW
        )
        return IterationFigures(iteration_time_s=t, energy_j=e)

    all_max = median(RoundKind.ALL_MAX)
    return all_max, all_max if plan_is_all_max else median(RoundKind.DEPLOYED)


def predicted_figures(plan: Plan, dp_degree: int) -> IterationFigures:
    """A plan's numbers (one pipeline) for the whole job of `dp_degree` pipelines."""
    return IterationFigures(
        iteration_time_s=plan.iteration_time, energy_j=plan.energy * max(1, dp_degree)
    )


def _saving(base: IterationFigures | None, new: IterationFigures | None) -> float | None:
    if base is None or new is None or base.energy_j <= 0:
        return None
    return 1.0 - new.energy_j / base.energy_j


def _slowdown(base: IterationFigures | None, new: IterationFigures | None) -> float | None:
    if base is None or new is None or base.iteration_time_s <= 0:
        return None
    return new.iteration_time_s / base.iteration_time_s - 1.0


class EnergyReport(BaseModel):
    """Measured and predicted figures of a job; savings are None until both sides are known."""

    measured_all_max: IterationFigures | None = None
    measured_deployed: IterationFigures | None = None
    predicted_all_max: IterationFigures | None = None
    predicted_deployed: IterationFigures | None = None
    measured_saving: float | None = Field(
        default=None, description="1 − E(deployed)/E(all-max), measured"
    )
    measured_slowdown: float | None = Field(
        default=None, description="T(deployed)/T(all-max) − 1, measured"
    )
    predicted_saving: float | None = None
    predicted_slowdown: float | None = None

    @classmethod
    def of(
        cls,
        *,
        measured_all_max: IterationFigures | None,
        measured_deployed: IterationFigures | None,
        predicted_all_max: IterationFigures | None,
        predicted_deployed: IterationFigures | None,
    ) -> EnergyReport:
        return cls(
            measured_all_max=measured_all_max,
            measured_deployed=measured_deployed,
            predicted_all_max=predicted_all_max,
            predicted_deployed=predicted_deployed,
            measured_saving=_saving(measured_all_max, measured_deployed),
            measured_slowdown=_slowdown(measured_all_max, measured_deployed),
            predicted_saving=_saving(predicted_all_max, predicted_deployed),
            predicted_slowdown=_slowdown(predicted_all_max, predicted_deployed),
        )
