"""3D parallelism as a wrapper: stage plans fan out to ranks, rank results fold into stages."""

from __future__ import annotations

import pytest

from perseus.errors import ConfigurationError, RankError
from perseus.protocol import JobInfo, ProfilingResult, RankInfo
from schedulers.parallel import Parallel3D

# dp=2, pp=2, tp=2: rank = dp·4 + pp·2 + tp
LAYOUT = [(r // 4, (r // 2) % 2, r % 2) for r in range(8)]


def _job() -> JobInfo:
    return JobInfo(pp_degree=2, dp_degree=2, tp_degree=2, world_size=8)


def _ranks(freqs: dict[int, list[int]] | None = None) -> list[RankInfo]:
    return [
        RankInfo(
            rank=r,
            dp_rank=d,
            pp_rank=p,
            tp_rank=t,
            available_frequencies=(freqs or {}).get(r, [1410, 1200, 900]),
        )
        for r, (d, p, t) in enumerate(LAYOUT)
    ]


def _result(rank: int, fwd_s: float, fwd_j: float) -> ProfilingResult:
    return ProfilingResult(
        rank=rank,
        iter_time=[1.0],
        iter_energy=[100.0 + rank],
        time_breakdown={"forward": [[fwd_s]], "backward": [[2 * fwd_s]]},
        energy_breakdown={"forward": [[fwd_j]], "backward": [[2 * fwd_j]]},
    )


def test_stage_plans_fan_out_to_every_rank_of_the_stage() -> None:
    par = Parallel3D(_job(), _ranks())
    plan = [[("forward", 1410), ("backward", 1200)], [("forward", 900), ("backward", 900)]]
    slow = [[("forward", 900), ("backward", 900)]] * 2
    schedules = par.schedules_for(plan, {1: slow})
    assert [s.rank for s in schedules] == list(range(8))
    for s, (d, p, _) in zip(schedules, LAYOUT, strict=True):
        assert s.frequencies == (slow if d == 1 else plan)[p]


def test_results_fold_into_stages_max_time_and_first_pipeline_tp_energy() -> None:
    par = Parallel3D(_job(), _ranks())
    results = [_result(r, fwd_s=0.1 + 0.01 * r, fwd_j=10.0 + r) for r in range(8)]
    m = par.measure(results)
    assert m is not None
    for stage in (0, 1):
        members = [r for r, (_, p, _) in enumerate(LAYOUT) if p == stage]
        first_dp = [r for r in members if LAYOUT[r][0] == 0]
        assert m.stages[stage].time_s["forward"] == pytest.approx(0.1 + 0.01 * max(members))
        assert m.stages[stage].energy_j["forward"] == pytest.approx(sum(10.0 + r for r in first_dp))
    assert par.measure(results[:-1]) is None  # a rank did not report


def test_missing_ranks_and_disjoint_clocks_are_refused() -> None:
    with pytest.raises(RankError, match="7 rank"):
        Parallel3D(_job(), _ranks()[:7])
    with pytest.raises(ConfigurationError, match="share no available frequency"):
        Parallel3D(_job(), _ranks({0: [1500]}))
