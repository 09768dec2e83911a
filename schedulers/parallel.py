"""3D parallelism as a wrapper around pipeline-stage schedulers.

Schedulers think in pipeline stages; `Parallel3D` maps between stages and ranks whenever
dp·tp > 1 (and is the identity when both are 1):

- results → one `StageMeasurement` per pipeline stage: an instruction's time is the
  **max** over all the stage's ranks (every tensor- and data-parallel copy: the slowest GPU
  sets the pace), its energy the **sum** over the stage's tensor-parallel ranks of the
  first data-parallel pipeline. Energies therefore describe *one* pipeline, the unit the
  profile, the solver and the plan accounting use; all pipelines run the same plan, so
  summing over dp would only scale every option by dp.
- a stage plan (per stage, the ``(instruction, freq_mhz)`` list of one iteration in
  execution order) → one `FrequencySchedule` per rank: every rank of a stage gets the
  stage's list; a data-parallel pipeline may get its own plan (stragglers).
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from perseus.errors import ConfigurationError, RankError
from perseus.protocol import FrequencySchedule, JobInfo, ProfilingResult, RankInfo

__all__ = ["Parallel3D", "RoundMeasurement", "StageMeasurement", "StagePlan"]

logger = logging.getLogger(__name__)

StagePlan = list[list[tuple[str, int]]]
"""Per pipeline stage, the (instruction, freq_mhz) list of one iteration in execution order."""


@dataclass(frozen=True)
class StageMeasurement:
    """One round's numbers for one pipeline stage (see the module docstring for the 3D rule).

    `time_s`/`energy_j`: per instruction name, the mean over the window's iterations and
    occurrences. `busy_s`/`compute_energy_j`: per iteration, the stage's total instruction
    time (busiest rank) and energy (tp ranks of the first pipeline).
    """

    time_s: dict[str, float]
    energy_j: dict[str, float]
    busy_s: float
    compute_energy_j: float
    iteration_energy_j: float


@dataclass(frozen=True)
class RoundMeasurement:
    """One complete round (every rank reported), aggregated.

    Attributes:
        stages: One entry per pipeline stage.
        iteration_time_s: Mean iteration time, max over all ranks.
        pipeline_energy_j: Mean iteration energy of one pipeline (first dp pipeline, all
            its GPUs).
        job_energy_j: Mean iteration energy of all GPUs of the job.
        busy_s: (dp_rank, pp_rank) → per-iteration instruction time of that stage copy
            (its busiest tp rank); used to spot a slow data-parallel pipeline.
        p2p_power_w: The median over ranks of the power a GPU drew while not computing,
            ``(iter_energy − Σ eᵢ) / (iter_time − Σ tᵢ)``, or None if no rank had idle time.
    """

    stages: list[StageMeasurement]
    iteration_time_s: float
    pipeline_energy_j: float
    job_energy_j: float
    busy_s: dict[tuple[int, int], float]
    p2p_power_w: float | None


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values)


class Parallel3D:
    """The job's ranks grouped by pipeline stage, and the two mappings of the module docstring.

    Raises `RankError` unless every rank of the job registered, and `ConfigurationError`
    when the GPUs share no SM clock.
    """

    def __init__(
        self,
        job_info: JobInfo,
        rank_infos: list[RankInfo],
        kinds: Sequence[str] = ("forward", "backward"),
    ) -> None:
        self.job_id = job_info.job_id
        self.kinds = tuple(kinds)
        """The instruction kinds every rank runs and reports."""
        self.rank_infos = rank_infos
        if len(rank_infos) != job_info.world_size:
            raise RankError(
                f"Job {job_info.job_id}: {len(rank_infos)} rank(s) registered but "
                f"world_size is {job_info.world_size}"
            )
        self.stage_ranks: list[list[RankInfo]] = [[] for _ in range(job_info.pp_degree)]
        for info in rank_infos:
            self.stage_ranks[info.pp_rank].append(info)
        common = set.intersection(*(set(r.available_frequencies) for r in rank_infos))
        if not common:
            raise ConfigurationError(
                f"Job {job_info.job_id}: the ranks' GPUs share no available frequency; "
                "Perseus needs one set of SM clocks that every GPU supports"
            )
        self.frequencies: list[int] = sorted(common, reverse=True)
        """SM frequencies (MHz) every GPU of the job supports, descending."""

    def schedules_for(
        self, plan: StagePlan, overrides: dict[int, StagePlan] | None = None
    ) -> list[FrequencySchedule]:
        """One `FrequencySchedule` per rank: every rank of a stage gets the stage's list."""
        overrides = overrides or {}
        cache: dict[tuple[int, int], FrequencySchedule] = {}
        out = []
        for info in self.rank_infos:
            p = overrides.get(info.dp_rank, plan)
            key = (id(p), info.pp_rank)
            if key not in cache:
                cache[key] = FrequencySchedule(rank=0, frequencies=p[info.pp_rank])
            out.append(cache[key].model_copy(update={"rank": info.rank}))
        return out

    def measure(self, results: list[ProfilingResult]) -> RoundMeasurement | None:
        """Aggregate one round's results (None when a rank did not report)."""
        by_rank = {r.rank: r for r in results}
        missing = [info.rank for info in self.rank_infos if info.rank not in by_rank]
        if missing:
            logger.warning("Job %s: no result from rank(s) %s this round", self.job_id, missing)
            return None
        first_dp = min(info.dp_rank for info in self.rank_infos)
        per_rank: dict[int, tuple[dict[str, float], dict[str, float], float, float]] = {}
        p2p: list[float] = []
        for info in self.rank_infos:
            res = by_rank[info.rank]
            if not res.iter_time or len(res.iter_time) != len(res.iter_energy):
                raise RankError(
                    f"Rank {info.rank} reported {len(res.iter_time)} iteration time(s) and "
                    f"{len(res.iter_energy)} energies; report one of each per iteration"
                )
            iters = len(res.iter_time)
            times: dict[str, float] = {}
            energies: dict[str, float] = {}
            busy = energy = 0.0
            for name in self.kinds:
                t = [x for it in res.time_breakdown.get(name, []) for x in it]
                e = [x for it in res.energy_breakdown.get(name, []) for x in it]
                if not t or len(t) != len(e):
                    raise RankError(
                        f"Rank {info.rank} reported {len(t)} {name!r} duration(s) and {len(e)} "
                        f"energies; time_breakdown and energy_breakdown need one entry per "
                        f"executed {name} (iteration × occurrence)"
                    )
                times[name], energies[name] = _mean(t), _mean(e)
                busy += math.fsum(t) / iters
                energy += math.fsum(e) / iters
            iter_time, iter_energy = _mean(res.iter_time), _mean(res.iter_energy)
            per_rank[info.rank] = (times, energies, busy, energy)
            idle = iter_time - busy
            if idle > 1e-6 * max(iter_time, 1e-12):
                p2p.append(max(0.0, (iter_energy - energy) / idle))
        stages = []
        busy_s: dict[tuple[int, int], float] = {}
        for stage, members in enumerate(self.stage_ranks):
            first = [m for m in members if m.dp_rank == first_dp]
            times = {name: max(per_rank[m.rank][0][name] for m in members) for name in self.kinds}
            energies = {
                name: math.fsum(per_rank[m.rank][1][name] for m in first) for name in self.kinds
            }
            for m in members:
                key = (m.dp_rank, stage)
                busy_s[key] = max(busy_s.get(key, 0.0), per_rank[m.rank][2])
            stages.append(
                StageMeasurement(
                    time_s=times,
                    energy_j=energies,
                    busy_s=max(per_rank[m.rank][2] for m in members),
                    compute_energy_j=math.fsum(per_rank[m.rank][3] for m in first),
                    iteration_energy_j=math.fsum(_mean(by_rank[m.rank].iter_energy) for m in first),
                )
            )
        return RoundMeasurement(
            stages=stages,
            iteration_time_s=max(_mean(r.iter_time) for r in results),
            pipeline_energy_j=math.fsum(s.iteration_energy_j for s in stages),
            job_energy_j=math.fsum(_mean(r.iter_energy) for r in results),
            busy_s=busy_s,
            p2p_power_w=statistics.median(p2p) if p2p else None,
        )
