"""The parallel layout's rules, in the one place the protocol, client and server share."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from perseus.domain.layout import ParallelLayout
from perseus.errors import ConfigurationError
from perseus.protocol import JobInfo


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
