"""The in-job fan-out's pure parts: how a group folds into its leader's result, and a rank's
place read from a real `DeviceMesh` (a one-rank gloo group)."""

from __future__ import annotations

import socket

import pytest
from paths import require_module

from perseus.client.place import mesh_place
from perseus.client.wire.fold import GroupFold
from perseus.client.wire.leaders import JobFanOut
from perseus.errors import ConfigurationError, RankError
from perseus.protocol import ParallelLayout, ProfilingResult

dist = require_module("torch.distributed")

# One stage's group: replicas 2 and 3 (the leader's block), tensor ranks 0 and 1;
# global rank = 10 + 2·(dp − 2) + tp, so the leader (dp 2, tp 0) is rank 10.
MEMBERS = {10: (2, 0), 11: (2, 1), 12: (3, 0), 13: (3, 1)}


def _result(rank: int, scale: float) -> ProfilingResult:
    """Two iterations of F F B B; instruction times and energies scaled per rank."""
    return ProfilingResult(
        rank=rank,
        iter_time=[1.0 * scale, 1.1 * scale],
        iter_energy=[100.0 * scale, 110.0],
        time_breakdown={
            "forward": [[0.1 * scale, 0.1], [0.1, 0.12 * scale]],
            "backward": [[0.2, 0.2 * scale], [0.2 * scale, 0.2]],
        },
        energy_breakdown={
            "forward": [[10.0 * scale, 10.0], [10.0, 12.0]],
            "backward": [[20.0, 20.0], [20.0, 20.0 * scale]],
        },
    )


def _fold() -> tuple[GroupFold, dict[int, ProfilingResult]]:
    fold = GroupFold(leader=10, members=sorted(MEMBERS), replicas=range(2, 4))
    results = {r: _result(r, 1.0 + (r - 10) / 10) for r in MEMBERS}
    return fold, results


def test_a_group_folds_into_one_result_that_speaks_for_it():
    fold, results = _fold()
    out = fold.fold(results, {r: dp for r, (dp, _) in MEMBERS.items()})
    assert out.rank == 10
    # Per iteration: the slowest GPU's time, every GPU's energy.
    assert out.iter_time == pytest.approx([1.3, 1.1 * 1.3])
    assert out.iter_energy == pytest.approx([sum(100.0 * (1 + k / 10) for k in range(4)), 440.0])
    # Per instruction: the slowest GPU's time; the energy of the leader replica's tp ranks.
    assert out.time_breakdown["forward"][0] == pytest.approx([0.13, 0.1])
    assert out.time_breakdown["forward"][1] == pytest.approx([0.1, 0.12 * 1.3])
    assert out.energy_breakdown["forward"][0] == pytest.approx([10.0 + 11.0, 20.0])
    assert out.energy_breakdown["forward"][1] == pytest.approx([20.0, 24.0])
    assert out.energy_breakdown["backward"][1] == pytest.approx([40.0, 20.0 + 22.0])
    # Per replica: slowest tp rank's mean iteration, busiest tp rank's work, all tp energy.
    r2, r3 = out.replicas
    assert (r2.dp_rank, r3.dp_rank) == (2, 3)
    assert r3.iter_time_s == pytest.approx(1.3 * 1.05)
    busy_13 = sum(
        x for k in ("forward", "backward") for it in results[13].time_breakdown[k] for x in it
    )
    assert r3.busy_s == pytest.approx(busy_13 / 2)
    assert r2.energy_j == pytest.approx((100.0 + 110.0) / 2 + (110.0 + 110.0) / 2)
    # Every GPU idles part of its iteration: the median of their blocking powers.
    assert out.idle_power_w is not None and out.idle_power_w > 0


def test_a_group_whose_rounds_differ_in_shape_is_refused_by_its_leader():
    fold, results = _fold()
    # As many numbers, another shape: the vectors reduce, the check in them does not hold.
    results[12] = results[12].model_copy(
        update={
            "time_breakdown": {"forward": [[0.1], [0.1, 0.1, 0.1]], "backward": [[0.2] * 2] * 2},
            "energy_breakdown": {"forward": [[1.0], [1.0, 1.0, 1.0]], "backward": [[2.0] * 2] * 2},
        }
    )
    with pytest.raises(RankError, match=r"group \[10-13\] measured rounds of different shapes"):
        fold.fold(results, {r: dp for r, (dp, _) in MEMBERS.items()})


@pytest.fixture
def group():
    """A one-rank gloo process group."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield dist
    dist.destroy_process_group()


def test_a_named_device_mesh_gives_the_place_and_other_dims_count_as_data_parallel(group):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(
        "cpu", (1, 1, 1, 1), mesh_dim_names=("pp", "dp_replicate", "dp_shard", "tp")
    )
    place = mesh_place(mesh)
    assert (place.pp_rank, place.pp_degree, place.dp_degree, place.tp_degree) == (0, 1, 1, 1)
    with pytest.raises(ConfigurationError, match="no dimension names"):
        mesh_place(init_device_mesh("cpu", (1,)))
    with pytest.raises(ConfigurationError, match="2 pipeline dimensions"):
        mesh_place(init_device_mesh("cpu", (1, 1), mesh_dim_names=("pp", "pipeline")))


def test_a_lone_rank_leads_itself_and_reports_its_replica(group):
    fanout = JobFanOut(
        group,
        rank=0,
        dp_rank=0,
        pp_rank=0,
        tp_rank=0,
        layout=ParallelLayout(1, 1, 1),
        per_stage=1,
        steps_per_round=2,
        pipeline_key="1f1b",
        gpu_name="NVIDIA A100 (emulated)",
        frequencies=[1410, 1005],
        emulated=True,
        switch_latency_s=0.012,
        timeout_s=10,
    )
    assert fanout.is_leader and fanout.registrar == 0 and fanout.members == [0]
    assert fanout.switch_latency_s == pytest.approx(0.012)
    assert fanout.share_job_id(lambda: "job-1") == "job-1"
    out = fanout.gather(_result(0, 1.0))
    assert out is not None and [r.dp_rank for r in out.replicas] == [0]
    assert out.time_breakdown == _result(0, 1.0).time_breakdown
