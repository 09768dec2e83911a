"""The torch.distributed bootstrap: layout checks and rank 0 sharing the job id."""

from __future__ import annotations

import socket

import pytest
from paths import require_module

from perseus.client.bootstrap import process_group, share_job_id
from perseus.client.place import check_layout
from perseus.errors import ConfigurationError, CoordinatorError

dist = require_module("torch.distributed")


@pytest.fixture
def group():
    """A one-rank gloo process group."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield process_group(0, 1)
    dist.destroy_process_group()


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ((0, 0, 0, 0, 2, 2, 1, 3), r"2·2·1 != world_size 3"),
        ((4, 0, 0, 0, 2, 2, 1, 4), r"rank=4 must be in \[0, 4\)"),
        ((0, 0, 0, 1, 1, 1, 1, 1), r"tp_rank=1 must be in \[0, 1\)"),
        ((0, 0, 0, 0, 1, 1, 0, 0), "tp_degree=0 must be at least 1"),
    ],
)
def test_bad_layouts_are_named(layout, message):
    with pytest.raises(ConfigurationError, match=message):
        check_layout(*layout)


def test_a_good_layout_passes():
    check_layout(5, 1, 1, 0, 2, 4, 1, 8)


def test_rank_0_registers_and_shares_the_id(group):
    calls = []

    def register() -> str:
        calls.append(1)
        return "job-1+meta"

    assert share_job_id(group, 0, register) == "job-1+meta"
    assert calls == [1]


def test_rank_0s_registration_error_is_raised_as_is(group):
    def register() -> str:
        raise CoordinatorError("Cannot reach the Perseus coordinator")

    with pytest.raises(CoordinatorError, match="Cannot reach"):
        share_job_id(group, 0, register)


def test_a_mismatched_process_group_is_named(group):
    with pytest.raises(ConfigurationError, match=r"rank=0, world_size=2 do not match"):
        process_group(0, 2)
