"""The training job's layout: stage placement per schedule, layer splits, nominal times."""

from __future__ import annotations

import pytest

from perseus.errors import ConfigurationError
from perseus.train.layout import PipelineLayout, Topology, nominal_times


def test_single_stage_schedules_take_one_count_per_rank():
    layout = PipelineLayout.build("1f1b", [2, 4, 3, 1])
    assert (layout.pp_degree, layout.chunks, layout.num_stages) == (4, 1, 4)
    assert layout.stages_of(2) == [2]
    with pytest.raises(ConfigurationError, match="runs one stage per rank"):
        PipelineLayout.build("1f1b", [2, 4], chunks=2)


def test_looped_and_v_shaped_placement():
    looped = PipelineLayout.build("interleaved", [1] * 8, pp_degree=4)
    assert [looped.stages_of(r) for r in range(4)] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    zbv = PipelineLayout.build("zbv", [1] * 8, pp_degree=4)
    assert [zbv.stages_of(r) for r in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    with pytest.raises(ConfigurationError, match="exactly 2 stages per rank"):
        PipelineLayout.build("zbv", [1] * 12, chunks=3, pp_degree=4)


def test_per_rank_counts_are_split_over_the_ranks_stages():
    zb = PipelineLayout.build("zb", [4, 8, 6, 2], pp_degree=4)
    assert zb.stage_layers == (2, 4, 3, 1, 2, 4, 3, 1)
    assert PipelineLayout.build("zbv", [3, 2], pp_degree=2).stage_layers == (2, 1, 1, 1)
    assert PipelineLayout.build("interleaved", [5, 4], chunks=2).rank_layers(0) == 5
    with pytest.raises(ConfigurationError, match="pipeline rank 3 has 1 layer"):
        PipelineLayout.build("zb", [2, 4, 3, 1], pp_degree=4)
    with pytest.raises(ConfigurationError, match="needs 8 \\(one per stage\\) or 4"):
        PipelineLayout.build("zb", [1] * 6, pp_degree=4)


def test_nominal_times_follow_each_stages_layers():
    layout = PipelineLayout.build("zb", [2, 4], pp_degree=2)  # stages 0,2 on rank 0
    times = nominal_times(layout, 0, 4.0)
    assert times["forward@0"] == pytest.approx(0.004)
    assert times["backward@2"] == pytest.approx(0.008)
    assert times["backward_input@2"] == times["backward_weight@2"] == pytest.approx(0.004)
    with pytest.raises(ConfigurationError, match="must be positive"):
        nominal_times(layout, 0, 0.0)


def test_ranks_are_pipeline_major_with_tensor_ranks_innermost():
    # dp 2 × pp 2 × tp 2: rank = (dp·pp + pp_rank)·tp + tp_rank
    places = [
        (t.dp_rank, t.pp_rank, t.tp_rank)
        for t in (Topology(rank=r, world_size=8, pp_degree=2, tp_degree=2) for r in range(8))
    ]
    assert places == [(d, p, t) for d in range(2) for p in range(2) for t in range(2)]
    topo = Topology(rank=5, world_size=8, pp_degree=2, tp_degree=2)
    assert topo.dp_degree == 2 and topo.rank_of(1, 0, 1) == 5
    # The hook takes the same layout as a validated value object (PerseusOptimizer.from_layout).
    assert (topo.layout.dp_degree, topo.layout.pp_degree, topo.layout.tp_degree) == (2, 2, 2)
    assert topo.layout.world_size == 8
    assert Topology(rank=3, world_size=4, pp_degree=2).rank_of(1, 1) == 3  # no tp: as before
    with pytest.raises(ConfigurationError, match="2 pipeline ranks × 2 tensor rank"):
        Topology(rank=0, world_size=6, pp_degree=2, tp_degree=2)


def test_the_device_is_given_or_local_rank_never_guessed(monkeypatch):
    """SLURM or mpirun set no LOCAL_RANK: every rank of a node would take GPU 0, so the job
    refuses unless --device-id says which GPU (a world of one has only one)."""
    from perseus.train.cli import _device_id

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with pytest.raises(ConfigurationError, match="pass --device-id"):
        _device_id(None, world_size=4)
    assert _device_id(None, world_size=1) == 0
    assert _device_id(3, world_size=4) == 3
    with pytest.raises(ConfigurationError, match="at least 0"):
        _device_id(-1, world_size=4)
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert _device_id(None, world_size=4) == 2
    monkeypatch.setenv("LOCAL_RANK", "two")
    with pytest.raises(ConfigurationError, match="not an integer"):
        _device_id(None, world_size=4)
