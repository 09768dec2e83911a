"""The order Perseus registers for a Megatron-Core job (`megatron_spec`), computed as
Megatron-Core's schedules compute theirs; no Megatron needed (the real schedules are checked
against it in `tests/integration/frameworks`)."""

from __future__ import annotations

import pytest

from perseus.domain.schedule import make_schedule
from perseus.errors import ConfigurationError
from perseus.integrations.megatron import megatron_spec


def _actions(orders) -> list[list[tuple[int, str, int]]]:
    return [[(i.stage, i.kind, i.microbatch) for i in order] for order in orders]


@pytest.mark.parametrize(("pp", "m"), [(2, 4), (4, 8), (3, 5), (1, 3)])
def test_without_interleaving_it_is_perseuss_1f1b(pp, m):
    spec = megatron_spec(m, pp)
    assert spec.num_chunks == 1 and spec.num_stages == pp
    assert _actions(spec.build().orders) == _actions(make_schedule("1f1b", pp, m).orders)


@pytest.mark.parametrize(("pp", "m", "vp"), [(2, 4, 2), (4, 8, 2), (2, 6, 3), (4, 12, 2)])
def test_interleaved_with_more_microbatches_than_ranks_is_perseuss_interleaved(pp, m, vp):
    spec = megatron_spec(m, pp, vp)
    ours = make_schedule("interleaved", pp, m, num_chunks=vp)
    assert spec.num_stages == pp * vp and spec.num_chunks == vp
    assert _actions(spec.build().orders) == _actions(ours.orders)


def test_interleaved_orders_are_megatrons_own_where_they_differ():
    # One group of pp microbatches: rank 0 runs all 8 forwards first (its warm-up covers the
    # whole iteration), then the backwards with the chunks reversed.
    spec = megatron_spec(4, 4, 2)
    rank0 = [tuple(a) for a in spec.orders[0]]
    assert rank0[:8] == [(c * 4, "forward", mb) for c in range(2) for mb in range(4)]
    assert rank0[8:] == [(s, "backward", mb) for s in (4, 0) for mb in range(4)]
    # The last rank: (vp − 1)·group = 4 warm-up forwards, then 1F1B.
    last = [tuple(a) for a in spec.orders[3]]
    assert [k for _, k, _ in last[:6]] == ["forward"] * 5 + ["backward"]
    assert last[5] == (7, "backward", 0)
    spec.build()  # a DAG Perseus can plan
    # A larger group (the config's microbatch_group_size_per_vp_stage) changes the order.
    assert megatron_spec(8, 2, 2, 4).orders != megatron_spec(8, 2, 2).orders


@pytest.mark.parametrize("group", [1, 9])
def test_a_group_size_megatron_refuses_is_refused(group):
    with pytest.raises(ConfigurationError, match="microbatch group size"):
        megatron_spec(8, 2, 2, group)
