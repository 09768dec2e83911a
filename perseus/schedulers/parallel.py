"""3D parallelism as a wrapper around pipeline-stage schedulers.

Schedulers think in pipeline ranks (plans) and pipeline (virtual) stages (profiles);
`Parallel3D` maps between them and the job's ranks whenever dp·tp > 1 (and is the identity
when both are 1, with one stage per rank):

- results → one `StageMeasurement` per pipeline rank and one `VirtualStageMeasurement` per
  pipeline (virtual) stage. A rank's ``time_breakdown[kind][iteration]`` lists are in
  execution order, so occurrence k of `kind` on pipeline rank r is the k-th instruction of
  that kind in r's order (`PipelineSchedule.orders[r]`): that is how a rank holding several
  stages (interleaved, looped BFS, ZBV) is split into its stages. An instruction's time is the
  **max** over all the stage's ranks (every tensor- and data-parallel copy: the slowest GPU
  sets the pace), its energy the **sum** over the stage's tensor-parallel ranks of the
  first data-parallel pipeline. Energies therefore describe *one* pipeline, the unit the
  profile, the solver and the plan accounting use; all pipelines run the same plan, so
  summing over dp would only scale every option by dp.
- a stage plan (per pipeline rank, the ``(instruction, freq_mhz)`` list of one iteration
  in execution order) → one `FrequencySchedule` per rank: every copy of a pipeline rank
  gets its list; a data-parallel pipeline may get its own plan (stragglers).
- a rank's energy windows (`perseus.protocol.EnergyWindow`: busy seconds per instruction
  of its order) → per rank, windows keyed by (stage, kind, clock) with the clocks the round
  ran (`perseus.schedulers.sweep.power_fit`): the per-GPU fit that turns them into energies.

**Leaders** (protocol 2, `JobInfo.leaders`): only the leaders register, report and get
schedules, and each speaks for its group (the tensor ranks of the replicas of its block,
`perseus.domain.layout.Leaders`). Its result arrives already folded in-job
(`perseus.client.wire.leaders`): each instruction's time is the slowest GPU of its group and its
energy the sum over the tensor ranks of the leader's own replica, and it carries one
`ReplicaFigures` per replica (busy time, iteration time and energy). So the rules above
hold with the leaders as the members: times are the max over a stage's leaders, energies
those of the leader of the first data-parallel pipeline, ``busy_s`` per (dp, pp) comes from
the replica figures, and the blocking power is the median of the leaders' medians. A
leader's schedule is its block's: `frequencies` for every replica of the block, and
`FrequencySchedule.replica_frequencies` for a replica whose pipeline runs its own plan.
A leader's energy windows are its own GPU's: with tensor parallelism the estimator's
energies are one GPU's, not its replica's sum (the iteration energies are the sum).
"""

from __future__ import annotations

import logging
import math
import statistics
from dataclasses import dataclass, field

from perseus.domain.layout import Leaders
from perseus.domain.robust import rank_time
from perseus.domain.schedule import PipelineSchedule
from perseus.errors import ConfigurationError, PlanError, RankError
from perseus.protocol import FrequencySchedule, JobInfo, ProfilingResult, RankInfo
from perseus.schedulers.measurement import (
    MAX_UNSURE_CLOCK_SHARE,
    RoundMeasurement,
    StageMeasurement,
    StagePlan,
    Unit,
    VirtualStageMeasurement,
    WindowRow,
    round_unit_times,
    unsure_clock_share,
    window_shares,
)

__all__ = ["Parallel3D"]

logger = logging.getLogger(__name__)


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values)


def _typical_time(results: list[ProfilingResult]) -> float:
    """The round's time as the guard and the energy report judge it: the slowest rank's
    median iteration time (`perseus.domain.robust.rank_time`)."""
    times = [t for t in (rank_time(r.iter_time) for r in results) if t is not None]
    return max(times) if times else math.nan


class Parallel3D:
    """The job's ranks grouped by pipeline rank, and the mappings of the module docstring.

    Raises `RankError` unless every rank of the job registered, `ConfigurationError` when
    the GPUs share no SM clock, and `PlanError` when the schedule's pipeline ranks are not
    the job's pp_degree.
    """

    def __init__(
        self, job_info: JobInfo, rank_infos: list[RankInfo], schedule: PipelineSchedule
    ) -> None:
        self.job_id = job_info.job_id
        self.schedule = schedule
        """The pipeline the job runs (its orders say which stage each occurrence is)."""
        if schedule.num_stages != job_info.pp_degree:
            raise PlanError(
                f"The {schedule.name} schedule has {schedule.num_stages} stage(s) but job "
                f"{job_info.job_id} has pp_degree {job_info.pp_degree}"
            )
        self.kinds = tuple(schedule.instruction_kinds())
        """The instruction kinds the job runs (every rank reports those it runs)."""
        self.rank_infos = rank_infos
        self._by_rank = {info.rank: info for info in rank_infos}
        self.leaders = job_info.leaders
        """Protocol 2: who talks for whom; None: every rank talks for itself."""
        if len(rank_infos) != job_info.talking_ranks:
            expected = (
                f"world_size is {job_info.world_size}"
                if self.leaders is None
                else f"the job has {job_info.talking_ranks} leader(s)"
            )
            raise RankError(
                f"Job {job_info.job_id}: {len(rank_infos)} rank(s) registered but {expected}"
            )
        self.stage_ranks: list[list[RankInfo]] = [[] for _ in range(job_info.pp_degree)]
        """Per pipeline rank, the job's talking ranks that run it (its dp and tp copies, or
        its leaders)."""
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
        self._occurrences: list[dict[str, list[int]]] = []
        """Per pipeline rank: kind → the stage of each occurrence, in execution order."""
        self._occurrence_index: list[dict[str, list[int]]] = []
        """Per pipeline rank: kind → the position in the order of each occurrence."""
        for order in schedule.orders:
            occ: dict[str, list[int]] = {}
            where: dict[str, list[int]] = {}
            for index, instr in enumerate(order):
                occ.setdefault(instr.kind, []).append(instr.stage)
                where.setdefault(instr.kind, []).append(index)
            self._occurrences.append(occ)
            self._occurrence_index.append(where)

    def schedules_for(
        self,
        plan: StagePlan,
        overrides: dict[int, StagePlan] | None = None,
        *,
        steps: int | None = None,
    ) -> list[FrequencySchedule]:
        """One `FrequencySchedule` per talking rank: every copy of a pipeline rank gets its
        list; a leader gets its block's (module docstring). Every rank gets the same `steps`
        (the round barrier holds them in step)."""
        overrides = overrides or {}
        leaders = self.leaders
        if leaders is not None:
            return [
                self._leader_schedule(leaders, info, plan, overrides, steps)
                for info in self.rank_infos
            ]
        cache: dict[tuple[int, int], FrequencySchedule] = {}
        out = []
        for info in self.rank_infos:
            p = overrides.get(info.dp_rank, plan)
            key = (id(p), info.pp_rank)
            if key not in cache:
                cache[key] = FrequencySchedule(rank=0, frequencies=p[info.pp_rank], steps=steps)
            out.append(cache[key].model_copy(update={"rank": info.rank}))
        return out

    def _leader_schedule(
        self,
        leaders: Leaders,
        info: RankInfo,
        plan: StagePlan,
        overrides: dict[int, StagePlan],
        steps: int | None,
    ) -> FrequencySchedule:
        base = plan[info.pp_rank]
        own = {
            dp: overrides[dp][info.pp_rank]
            for dp in leaders.block(info.dp_rank)
            if dp in overrides and overrides[dp][info.pp_rank] != base
        }
        return FrequencySchedule(
            rank=info.rank, frequencies=base, replica_frequencies=own, steps=steps
        )

    def check_result(self, res: ProfilingResult, *, breakdowns: bool = True) -> None:
        """Refuse (`RankError`, naming the rank, the kind and the job) a result of a rank the
        job does not have, or whose iteration lists differ in length, or (`breakdowns`)
        whose breakdowns do not hold one entry per instruction of the rank's order, per
        iteration."""
        info = self._by_rank.get(res.rank)
        if info is None:
            raise RankError(f"Rank {res.rank} is not a rank of job {self.job_id}")
        if breakdowns:
            self._check_shapes(info, res)
        else:
            self._check_iterations(info, res)

    @staticmethod
    def _check_iterations(info: RankInfo, res: ProfilingResult) -> None:
        if not res.iter_time or len(res.iter_time) != len(res.iter_energy):
            raise RankError(
                f"Rank {info.rank} reported {len(res.iter_time)} iteration time(s) and "
                f"{len(res.iter_energy)} energies; report one of each per iteration"
            )

    def _check_shapes(self, info: RankInfo, res: ProfilingResult) -> None:
        self._check_iterations(info, res)
        order_len = len(self.schedule.orders[info.pp_rank])
        for w, window in enumerate(res.energy_windows or ()):
            if len(window.busy_s) != order_len:
                raise RankError(
                    f"Rank {info.rank} reported energy window {w} with {len(window.busy_s)} "
                    f"busy time(s), but pipeline rank {info.pp_rank} of the {self.schedule.name} "
                    f"schedule runs {order_len} instruction(s) per iteration: one each"
                )
        iters = len(res.iter_time)
        occ = self._occurrences[info.pp_rank]
        where = f"pipeline rank {info.pp_rank} of the {self.schedule.name} schedule"
        for name in [*self.kinds, *sorted(set(res.time_breakdown) - set(self.kinds))]:
            t_iters = res.time_breakdown.get(name, [])
            e_iters = res.energy_breakdown.get(name, [])
            stages = occ.get(name, [])
            if not stages:
                if any(t_iters) or any(e_iters):
                    n = sum(len(x) for x in t_iters)
                    raise RankError(
                        f"Rank {info.rank} reported {n} {name!r} duration(s), but {where} "
                        f"runs no {name}"
                    )
                continue
            if len(t_iters) != iters or len(e_iters) != iters:
                raise RankError(
                    f"Rank {info.rank} reported {len(t_iters)} {name!r} duration list(s) and "
                    f"{len(e_iters)} energy list(s) for {iters} iteration(s); time_breakdown "
                    f"and energy_breakdown need one list per iteration, each with one entry "
                    f"per executed {name}"
                )
            for it, (ts, es) in enumerate(zip(t_iters, e_iters, strict=True)):
                if len(ts) != len(stages) or len(es) != len(stages):
                    raise RankError(
                        f"Rank {info.rank} reported {len(ts)} {name!r} duration(s) and "
                        f"{len(es)} energies in iteration {it}, but {where} runs "
                        f"{len(stages)} {name} per iteration; report one entry per executed "
                        f"{name}, in execution order"
                    )

    def _rank_numbers(self, info: RankInfo, res: ProfilingResult) -> _RankNumbers:
        """One rank's means per kind and per (stage, kind), checked against its order."""
        self._check_shapes(info, res)
        iters = len(res.iter_time)
        occ = self._occurrences[info.pp_rank]
        numbers = _RankNumbers()
        for name in self.kinds:
            t_iters = res.time_breakdown.get(name, [])
            e_iters = res.energy_breakdown.get(name, [])
            stages = occ.get(name, [])
            if not stages:
                continue
            t_all = [x for ts in t_iters for x in ts]
            e_all = [x for es in e_iters for x in es]
            numbers.time_s[name], numbers.energy_j[name] = _mean(t_all), _mean(e_all)
            numbers.busy_s += math.fsum(t_all) / iters
            numbers.energy += math.fsum(e_all) / iters
            per_stage: dict[int, tuple[list[float], list[float]]] = {}
            for ts, es in zip(t_iters, e_iters, strict=True):
                for stage, t, e in zip(stages, ts, es, strict=True):
                    acc = per_stage.setdefault(stage, ([], []))
                    acc[0].append(t)
                    acc[1].append(e)
            for stage, (ts, es) in per_stage.items():
                numbers.stage_time_s[stage, name] = _mean(ts)
                numbers.stage_energy_j[stage, name] = _mean(es)
        return numbers

    def _units(
        self,
        info: RankInfo,
        res: ProfilingResult,
        frequencies: list[tuple[str, int]],
    ) -> tuple[list[WindowRow], dict[Unit, tuple[float, int]], frozenset[Unit]]:
        """One rank's windows, instruction times keyed by (stage, kind, clock), and the
        units that ran only while a clock change landed (`round_unit_times`). No windows
        where more than `MAX_UNSURE_CLOCK_SHARE` of the round ran at a clock the rank cannot
        know (`unsure_clock_share`): they would charge power to clocks the GPU did not run."""
        order = self.schedule.orders[info.pp_rank]
        units = [(i.stage, i.kind, int(f)) for i, (_, f) in zip(order, frequencies, strict=True)]
        where, lag_s = self._occurrence_index[info.pp_rank], info.switch_latency_s or 0.0
        idle = res.idle_before_s
        rows: list[WindowRow] = []
        times, landing = round_unit_times(units, where, res.time_breakdown, lag_s, idle)
        if not res.energy_windows:  # nothing to share out (every round: keep it cheap)
            return rows, times, landing
        unsure = unsure_clock_share(units, where, res.time_breakdown, lag_s, idle)
        if unsure > MAX_UNSURE_CLOCK_SHARE:
            logger.debug(
                "Job %s: rank %d's energy windows of this round are left out of the power fit: "
                "%.0f %% of its busy seconds ran while a clock change landed that was asked for "
                "before the one before it had (its switch takes %.1f ms), at a clock it cannot "
                "know",
                self.job_id,
                info.rank,
                unsure * 100,
                lag_s * 1000,
            )
            return rows, times, landing
        shares = window_shares(units, where, res.time_breakdown, lag_s, idle)
        for w in res.energy_windows:
            rows.append(
                WindowRow(
                    w.energy_j,
                    w.time_s,
                    _split(shares, w.busy_s),
                    w.tail_s,
                    _split(shares, w.tail_busy_s, strict=False),
                    after=_by_unit(shares, w.after_s),
                    tail_after=_by_unit(shares, w.tail_after_s),
                )
            )
        return rows, times, landing

    def measure(
        self,
        results: list[ProfilingResult],
        frequencies: dict[int, list[tuple[str, int]]] | None = None,
    ) -> RoundMeasurement | None:
        """Aggregate one round's results (None when a rank did not report).

        `frequencies`: per rank, the (kind, MHz) list the round ran; with it, the ranks'
        energy windows and instruction times are keyed by unit (`RoundMeasurement.windows`).

        Raises `RankError`, naming the rank and the kind, when a rank's breakdowns do not
        hold one entry per instruction of that kind in its order, per iteration.
        """
        by_rank = {r.rank: r for r in results}
        missing = [info.rank for info in self.rank_infos if info.rank not in by_rank]
        if missing:
            logger.warning("Job %s: no result from rank(s) %s this round", self.job_id, missing)
            return None
        first_dp = min(info.dp_rank for info in self.rank_infos)
        per_rank: dict[int, _RankNumbers] = {}
        p2p: list[float] = []
        windows: dict[int, list[WindowRow]] = {}
        unit_time: dict[int, dict[Unit, tuple[float, int]]] = {}
        landing_only: dict[int, frozenset[Unit]] = {}
        for info in self.rank_infos:
            res = by_rank[info.rank]
            numbers = self._rank_numbers(info, res)
            per_rank[info.rank] = numbers
            if frequencies is not None and info.rank in frequencies:
                rows, times, landing = self._units(info, res, frequencies[info.rank])
                unit_time[info.rank] = times
                if landing:
                    landing_only[info.rank] = landing
                if res.energy_windows is not None:
                    windows[info.rank] = rows
            if self.leaders is not None:  # the median of its group, measured in-job
                if res.idle_power_w is not None:
                    p2p.append(res.idle_power_w)
                continue
            iter_time, iter_energy = _mean(res.iter_time), _mean(res.iter_energy)
            idle = iter_time - numbers.busy_s
            if idle > 1e-6 * max(iter_time, 1e-12):
                p2p.append(max(0.0, (iter_energy - numbers.energy) / idle))
        stages = []
        busy_s: dict[tuple[int, int], float] = {}
        for pp, members in enumerate(self.stage_ranks):
            first = [m for m in members if m.dp_rank == first_dp]
            kinds = list(self._occurrences[pp])
            times = {k: max(per_rank[m.rank].time_s[k] for m in members) for k in kinds}
            energies = {k: math.fsum(per_rank[m.rank].energy_j[k] for m in first) for k in kinds}
            if self.leaders is None:
                for m in members:
                    key = (m.dp_rank, pp)
                    busy_s[key] = max(busy_s.get(key, 0.0), per_rank[m.rank].busy_s)
                iteration_energy_j = math.fsum(_mean(by_rank[m.rank].iter_energy) for m in first)
            else:  # each leader measured its replicas in-job
                iteration_energy_j = 0.0
                for m in members:
                    for figures in by_rank[m.rank].replicas:
                        key = (figures.dp_rank, pp)
                        busy_s[key] = max(busy_s.get(key, 0.0), figures.busy_s)
                        if figures.dp_rank == first_dp:
                            iteration_energy_j += figures.energy_j
            stages.append(
                StageMeasurement(
                    time_s=times,
                    energy_j=energies,
                    busy_s=max(busy_s[d, p] for d, p in busy_s if p == pp),
                    compute_energy_j=math.fsum(per_rank[m.rank].energy for m in first),
                    iteration_energy_j=iteration_energy_j,
                )
            )
        virtual = []
        for stage, pp in enumerate(self.schedule.stage_ranks):
            members = self.stage_ranks[pp]
            first = [m for m in members if m.dp_rank == first_dp]
            kinds = [k for k in self.kinds if stage in self._occurrences[pp].get(k, ())]
            virtual.append(
                VirtualStageMeasurement(
                    rank=pp,
                    time_s={
                        k: max(per_rank[m.rank].stage_time_s[stage, k] for m in members)
                        for k in kinds
                    },
                    energy_j={
                        k: math.fsum(per_rank[m.rank].stage_energy_j[stage, k] for m in first)
                        for k in kinds
                    },
                )
            )
        return RoundMeasurement(
            stages=stages,
            virtual_stages=virtual,
            iteration_time_s=max(_mean(r.iter_time) for r in results),
            pipeline_energy_j=math.fsum(s.iteration_energy_j for s in stages),
            job_energy_j=math.fsum(_mean(r.iter_energy) for r in results),
            busy_s=busy_s,
            p2p_power_w=statistics.median(p2p) if p2p else None,
            iterations=max(len(r.iter_time) for r in results),
            windows=windows,
            unit_time=unit_time,
            landing_only=landing_only,
            typical_iteration_time_s=_typical_time(results),
        )


@dataclass
class _RankNumbers:
    """One rank's round, reduced: means per kind and per (stage, kind), per-iteration sums."""

    time_s: dict[str, float] = field(default_factory=dict)
    energy_j: dict[str, float] = field(default_factory=dict)
    stage_time_s: dict[tuple[int, str], float] = field(default_factory=dict)
    stage_energy_j: dict[tuple[int, str], float] = field(default_factory=dict)
    busy_s: float = 0.0
    energy: float = 0.0


def _split(
    shares: list[list[tuple[Unit, float]]], seconds: list[float], *, strict: bool = True
) -> dict[Unit, float]:
    """Per unit, its share of each instruction's `seconds` (an entry per instruction of the
    rank's order; not `strict`: or none at all)."""
    out: dict[Unit, float] = {}
    for split, b in zip(shares, seconds, strict=strict):
        for unit, share in split if b > 0 else ():
            out[unit] = out.get(unit, 0.0) + b * share
    return out


def _by_unit(
    shares: list[list[tuple[Unit, float]]], bands: list[list[float]]
) -> dict[Unit, tuple[float, ...]]:
    """Per unit, its seconds in each band after work stopped (`EnergyWindow.after_s`, per
    band and instruction), split as the instructions' busy seconds are."""
    per_band = [_split(shares, band) for band in bands]
    units = {u for band in per_band for u in band}
    return {u: tuple(band.get(u, 0.0) for band in per_band) for u in units}
