"""torch's `pipeline_order` of every schedule class of torch 2.13, as `attach` reads it: the
compute actions of each rank become a `PipelineSpec` that the coordinator can plan.

The orders come from torch itself (`get_schedule_ops`, torch's schedule visualizer, builds
each schedule class and returns its ``pipeline_order``) at 4 pipeline ranks.
"""

from __future__ import annotations

import pytest
from paths import require_module

from perseus.errors import ConfigurationError
from perseus.integrations.orders import compute_orders, renumber_single_stage
from perseus.protocol import PipelineSpec

ts = require_module("torch.distributed.pipelining.schedules")
get_schedule_ops = require_module(
    "torch.distributed.pipelining._schedule_visualizer"
).get_schedule_ops

RANKS = 4
CASES = [
    ("ScheduleGPipe", 1, 4),
    ("Schedule1F1B", 1, 8),
    ("ScheduleInterleaved1F1B", 2, 4),
    ("ScheduleInterleaved1F1B", 4, 4),
    ("ScheduleInterleaved1F1B", 2, 6),
    ("ScheduleLoopedBFS", 2, 4),
    ("ScheduleInterleavedZeroBubble", 2, 8),
    ("ScheduleInterleavedZeroBubble", 4, 4),
    ("ScheduleZBVZeroBubble", 2, 8),
    ("ScheduleDualPipeV", 2, 8),
]


def torch_order(name: str, chunks: int, microbatches: int) -> dict[int, list[object]]:
    ops = get_schedule_ops(getattr(ts, name), RANKS, microbatches, num_stages_per_rank=chunks)
    return dict(enumerate(ops))


def spec_of(name: str, chunks: int, microbatches: int) -> PipelineSpec:
    orders = compute_orders(torch_order(name, chunks, microbatches), RANKS, where=name)
    if chunks == 1:
        orders = renumber_single_stage(orders, microbatches)
    return PipelineSpec(
        schedule=name,
        num_stages=RANKS * chunks,
        num_microbatches=microbatches,
        num_chunks=chunks,
        orders=orders,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(("name", "chunks", "microbatches"), CASES)
def test_every_schedule_class_becomes_a_plannable_pipeline(name, chunks, microbatches):
    spec = spec_of(name, chunks, microbatches)
    schedule = spec.build()  # the DAG: no missing, repeated or deadlocking instruction
    kinds = {kind for order in spec.orders for _, kind, _ in order}
    split = name in ("ScheduleInterleavedZeroBubble", "ScheduleZBVZeroBubble")
    want = {"forward", "backward_input", "backward_weight"} if split else {"forward", "backward"}
    if name == "ScheduleDualPipeV":  # full backwards inside OVERLAP_F_B, split ones at the end
        want = {"forward", "backward", "backward_input", "backward_weight"}
    assert kinds == want
    stages = RANKS * chunks
    if name != "ScheduleDualPipeV":  # DualPipeV mixes full and split backwards
        per_stage = 3 if split else 2
        assert len(schedule.instructions()) == per_stage * stages * microbatches


def test_zbv_places_stages_in_a_v():
    spec = spec_of("ScheduleZBVZeroBubble", 2, 8)
    for rank, order in enumerate(spec.orders):
        assert {stage for stage, _, _ in order} == {rank, 2 * RANKS - 1 - rank}


def test_dualpipev_overlapped_actions_are_flattened_in_order():
    raw = torch_order("ScheduleDualPipeV", 2, 8)
    overlap = next(a for a in raw[0] if a is not None and a.sub_actions)
    flat = compute_orders(raw, RANKS)[0]
    first = [
        (a.stage_index, a.computation_type.value, a.microbatch_index) for a in overlap.sub_actions
    ]
    letters = {"forward": "F", "backward": "B", "backward_input": "I", "backward_weight": "W"}
    as_torch = [(s, letters[k], m) for s, k, m in flat]
    k = as_torch.index(first[0])
    assert as_torch[k : k + len(first)] == first


def test_torch_2_13_1f1b_last_rank_order_is_renumbered_from_zero():
    raw = compute_orders(torch_order("Schedule1F1B", 1, 4), RANKS)
    last = [mb for _, kind, mb in raw[RANKS - 1] if kind == "forward"]
    if last == [0, 1, 2, 3]:
        pytest.skip("this torch numbers the last rank's forwards correctly")
    assert last == [1, 2, 3, 4]  # torch 2.13's off-by-one; it executes F0..F3
    fixed = renumber_single_stage(raw, 4)
    want = [(kind, mb) for mb in range(4) for kind in ("forward", "backward")]
    assert [(k, m) for _, k, m in fixed[RANKS - 1]] == want
    assert fixed[:-1] == raw[:-1]


def test_bubbles_and_communication_actions_are_dropped():
    order = {0: [None, ts._Action(0, ts.FORWARD, 0), ts._Action(0, ts.REDUCE_GRAD, None)]}
    order[0].insert(1, ts._Action(0, ts.UNSHARD, None))
    assert compute_orders(order, 1) == [[(0, "forward", 0)]]


def test_an_order_for_other_ranks_is_refused():
    with pytest.raises(ConfigurationError, match=r"pipeline_order has ranks \[0, 1\]"):
        compute_orders({0: [], 1: []}, 4)
