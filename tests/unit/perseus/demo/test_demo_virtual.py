"""`VirtualCluster`'s tensor-parallel copies: numbering, lockstep, and refused schedules."""

from __future__ import annotations

import pytest

from perseus.demo.virtual import VirtualCluster
from perseus.domain.schedule import make_schedule
from perseus.protocol import FrequencySchedule
from perseus.synth import stage_workloads

GPU = "A100-SXM"
PIPELINE = make_schedule("1f1b", 2, 3)


def cluster(**kw) -> VirtualCluster:
    workloads = {}
    for stage, (fwd, bwd) in enumerate(stage_workloads(GPU, [1.0, 1.4], base_forward_ms=5.0)):
        workloads[stage, "forward"], workloads[stage, "backward"] = fwd, bwd
    return VirtualCluster(PIPELINE, workloads, gpu_type=GPU, switch_latency_s=0.0, **kw)


def schedules(c: VirtualCluster, freq_of: dict[int, int] | None = None) -> list[FrequencySchedule]:
    """Every rank at its GPU's top clock, or at `freq_of[rank]`."""
    top = c.gpus[0].supported_sm_clocks_mhz()[0]
    out = []
    for r in range(c.world_size):
        order = PIPELINE.orders[c.layout_of(r)[1]]
        f = (freq_of or {}).get(r, top)
        out.append(FrequencySchedule(rank=r, frequencies=[(i.kind, f) for i in order]))
    return out


def test_tp_copies_are_numbered_tp_fastest_and_run_their_stage_in_lockstep():
    c = cluster(dp_degree=2, tp_degree=2)
    assert c.world_size == 8 and c.job_record().tp_degree == 2
    infos = c.rank_infos()
    assert [(i.rank, i.dp_rank, i.pp_rank, i.tp_rank) for i in infos] == [
        ((d * 2 + p) * 2 + t, d, p, t) for d in range(2) for p in range(2) for t in range(2)
    ]
    results = c.run_round(schedules(c))
    single = cluster(dp_degree=2).run_round(schedules(cluster(dp_degree=2)))
    for res in results:
        dp, pp, _ = c.layout_of(res.rank)
        alone = single[dp * 2 + pp]  # the same GPU's work without tensor parallelism
        assert res.iter_time == alone.iter_time
        assert res.time_breakdown == alone.time_breakdown
        assert res.iter_energy == pytest.approx(alone.iter_energy, abs=1e-3)


def test_the_slowest_tp_copy_sets_the_pace():
    c = cluster(tp_degree=2)
    slow = c.gpus[0].supported_sm_clocks_mhz()[30]
    fast = c.run_round(schedules(c))
    one_slow = cluster(tp_degree=2).run_round(schedules(c, {1: slow}))
    both_slow = cluster(tp_degree=2).run_round(schedules(c, {0: slow, 1: slow}))
    time_of = {
        name: max(r.iter_time[0] for r in res)
        for name, res in (("fast", fast), ("one", one_slow), ("both", both_slow))
    }
    assert time_of["fast"] < time_of["one"] == pytest.approx(time_of["both"], rel=1e-12)
    # The fast copy ran its own instructions at its own clock, and waited for its peer.
    assert one_slow[0].time_breakdown == fast[0].time_breakdown
    assert one_slow[0].iter_energy[0] > fast[0].iter_energy[0]


def test_a_schedule_that_is_not_the_ranks_order_is_refused():
    c = cluster(tp_degree=2)
    bad = schedules(c)
    bad[3] = FrequencySchedule(rank=3, frequencies=bad[3].frequencies[:-1])
    with pytest.raises(ValueError, match="Rank 3's schedule lists"):
        c.run_round(bad)
    with pytest.raises(ValueError, match="No schedule for rank 2"):
        c.run_round(bad[:2])
