"""The parallel layout's rules, and who leads, in the one place the protocol, client and server
share."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from perseus.domain.layout import Leaders, ParallelLayout
from perseus.errors import ConfigurationError
from perseus.protocol import FrequencySchedule, JobInfo, RankInfo


def test_world_size_and_coordinates() -> None:
    layout = ParallelLayout(dp_degree=2, pp_degree=4, tp_degree=2)
    assert layout.world_size == 16
    layout.check_world_size(16)
    with pytest.raises(ConfigurationError, match=r"2·4·2 != world_size 8"):
        layout.check_world_size(8)
    assert layout.out_of_range(rank=15, dp_rank=1, pp_rank=3, tp_rank=1) is None
    assert layout.out_of_range(rank=3, dp_rank=0, pp_rank=4, tp_rank=0) == ("pp_rank", 4, 4)
    with pytest.raises(ConfigurationError, match=r"rank=16 must be in \[0, 16\)"):
        layout.check_coordinates(rank=16, dp_rank=0, pp_rank=0, tp_rank=0)
    with pytest.raises(ConfigurationError, match="pp_degree=0 must be at least 1"):
        ParallelLayout(dp_degree=1, pp_degree=0, tp_degree=1)


def test_the_wire_model_uses_the_same_rule() -> None:
    assert JobInfo(pp_degree=4, dp_degree=2, tp_degree=1, world_size=8).layout.world_size == 8
    with pytest.raises(ValidationError, match=r"4·2·1 != world_size 4"):
        JobInfo(pp_degree=2, dp_degree=4, tp_degree=1, world_size=4)


def test_leaders_cut_the_replicas_into_blocks_and_lead_from_each_blocks_first() -> None:
    layout = ParallelLayout(dp_degree=5, pp_degree=3, tp_degree=2)
    one = Leaders(layout)
    assert one.replicas == (0,) and one.count == 3 and one.block(0) == range(5)
    assert [one.leader_replica(d) for d in range(5)] == [0] * 5
    two = Leaders(layout, per_stage=2)
    assert two.replicas == (0, 2) and two.count == 6
    assert [two.leader_replica(d) for d in range(5)] == [0, 0, 2, 2, 2]
    assert two.block(0) == range(0, 2) and two.block(2) == range(2, 5)
    assert two.is_leader(dp_rank=2, tp_rank=0)
    assert not two.is_leader(dp_rank=2, tp_rank=1) and not two.is_leader(dp_rank=1, tp_rank=0)
    every = Leaders(layout, per_stage=5)
    assert every.replicas == tuple(range(5)) and all(len(every.block(d)) == 1 for d in range(5))
    assert "replicas 0, 2 of each pipeline stage (6 leader(s))" in two.rule
    with pytest.raises(
        ConfigurationError, match=r"leaders_per_stage=6 must be between 1 and dp_degree \(5\)"
    ):
        Leaders(layout, per_stage=6)


def test_a_job_declares_its_leaders_under_protocol_2_only() -> None:
    old = JobInfo(pp_degree=4, dp_degree=2, tp_degree=2, world_size=16)
    assert old.leaders is None and old.talking_ranks == 16
    new = JobInfo(pp_degree=4, dp_degree=2, tp_degree=2, world_size=16, protocol_version=2)
    assert new.leaders_per_stage == 1 and new.talking_ranks == 4
    with pytest.raises(ValidationError, match="leaders_per_stage needs protocol_version 2"):
        JobInfo(pp_degree=4, dp_degree=2, tp_degree=1, world_size=8, leaders_per_stage=1)
    with pytest.raises(ValidationError, match="must be between 1 and dp_degree"):
        JobInfo(
            pp_degree=4,
            dp_degree=2,
            tp_degree=1,
            world_size=8,
            protocol_version=2,
            leaders_per_stage=3,
        )
    with pytest.raises(ValidationError, match="less than or equal to 2"):
        JobInfo(pp_degree=1, dp_degree=1, tp_degree=1, world_size=1, protocol_version=3)


def test_a_leaders_schedule_gives_each_replica_its_list() -> None:
    schedule = FrequencySchedule(
        rank=0, frequencies=[("forward", 1410)], replica_frequencies={3: [("forward", 900)]}
    )
    wire = FrequencySchedule.model_validate_json(schedule.model_dump_json())
    assert wire.frequencies_for(3) == [("forward", 900)]
    assert wire.frequencies_for(1) == [("forward", 1410)]
    assert wire.lists() == [[("forward", 1410)], [("forward", 900)]]
    with pytest.raises(ValidationError, match="ascending"):
        RankInfo(
            rank=0, dp_rank=0, pp_rank=0, tp_rank=0, available_frequencies=[1], replicas=[1, 0]
        )


def test_rank_numbering_is_pipeline_major_and_invertible() -> None:
    layout = ParallelLayout.of_world(12, pp_degree=3, tp_degree=2)
    assert (layout.dp_degree, layout.pp_degree, layout.tp_degree) == (2, 3, 2)
    ranks = [
        layout.rank_of(dp, pp, tp) for dp in range(2) for pp in range(3) for tp in range(2)
    ]
    assert ranks == list(range(12))  # tensor ranks fastest, then stages, then replicas
    assert all(layout.rank_of(*layout.coordinates(r)) == r for r in range(12))
    assert layout.coordinates(7) == (1, 0, 1)


def test_layout_refuses_a_world_it_does_not_divide_and_coordinates_outside_it() -> None:
    with pytest.raises(ConfigurationError, match="not a multiple of the 3 pipeline ranks"):
        ParallelLayout.of_world(8, pp_degree=3)
    with pytest.raises(ConfigurationError, match="pp_degree=0"):
        ParallelLayout.of_world(8, pp_degree=0)
    layout = ParallelLayout(2, 2, 1)
    with pytest.raises(ConfigurationError, match=r"pp_rank=2 must be in \[0, 2\)"):
        layout.rank_of(0, 2)
    with pytest.raises(ConfigurationError, match=r"rank=4 must be in \[0, 4\)"):
        layout.coordinates(4)
