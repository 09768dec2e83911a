"""Pipeline schedules checked by hand, the DAG's edges, and orders from any source."""

from __future__ import annotations

import networkx as nx
import pytest

from perseus.domain.schedule import Instruction, PipelineSchedule, make_schedule
from perseus.errors import ScheduleError


def _names(order: tuple[Instruction, ...]) -> str:
    return " ".join(str(i).split("@")[0] for i in order)


def test_1f1b_orders_by_hand() -> None:
    s = make_schedule("1f1b", 3, 4)
    assert [_names(o) for o in s.orders] == [
        "F0 F1 F2 B0 F3 B1 B2 B3",
        "F0 F1 B0 F2 B1 F3 B2 B3",
        "F0 B0 F1 B1 F2 B2 F3 B3",
    ]


def test_1f1b_with_fewer_microbatches_than_stages() -> None:
    s = make_schedule("1f1b", 4, 2)
    # warm-up = min(S-s-1, M): 2, 2, 1, 0 forwards.
    assert [_names(o) for o in s.orders] == ["F0 F1 B0 B1"] * 3 + ["F0 B0 F1 B1"]


def test_gpipe_orders_by_hand() -> None:
    s = make_schedule("gpipe", 2, 3)
    assert [_names(o) for o in s.orders] == ["F0 F1 F2 B0 B1 B2"] * 2


def test_interleaved_orders_by_hand() -> None:
    s = make_schedule("interleaved", 2, 4, num_chunks=2)
    assert [" ".join(map(str, o)) for o in s.orders] == [
        "F0@s0 F1@s0 F0@s2/r0 F1@s2/r0 F2@s0 B0@s2/r0 F3@s0 B1@s2/r0 "
        "F2@s2/r0 B0@s0 F3@s2/r0 B1@s0 B2@s2/r0 B3@s2/r0 B2@s0 B3@s0",
        "F0@s1 F1@s1 F0@s3/r1 B0@s3/r1 F1@s3/r1 B1@s3/r1 F2@s1 B0@s1 "
        "F3@s1 B1@s1 F2@s3/r1 B2@s3/r1 F3@s3/r1 B3@s3/r1 B2@s1 B3@s1",
    ]
    assert s.stage_ranks == (0, 1, 0, 1)


def test_zero_bubble_h1_orders_by_hand() -> None:
    s = make_schedule("zb", 3, 4)
    # 1F1B with B split into I and W; rank s defers its W's by s (torch's order).
    assert [_names(o) for o in s.orders] == [
        "F0 F1 F2 I0 W0 F3 I1 W1 I2 W2 I3 W3",
        "F0 F1 I0 F2 I1 W0 F3 I2 W1 I3 W2 W3",
        "F0 I0 F1 I1 F2 I2 W0 F3 I3 W1 W2 W3",
    ]


def _makespan(schedule: PipelineSchedule, duration: dict[str, float]) -> float:
    """The DAG's longest path with every instruction of a kind taking `duration[kind]`."""
    g = schedule.dag()
    finish: dict[Instruction, float] = {}
    for node in nx.topological_sort(g):
        start = max((finish[u] for u in g.predecessors(node)), default=0.0)
        finish[node] = start + duration[node.kind]
    return max(finish.values())


@pytest.mark.parametrize(("S", "M"), [(4, 8), (8, 16)])
def test_zero_bubble_h1_has_the_papers_bubble_and_1f1b_peak_memory(S: int, M: int) -> None:
    # The ZB paper's uniform case T_F = T_I = T_W = 1 (B = 2): 1F1B's bubble is
    # (S-1)(T_F+T_I+T_W), ZB-H1's (S-1)(T_F+T_I-T_W), on every rank's 3M of work.
    units = {"forward": 1.0, "backward": 2.0, "backward_input": 1.0, "backward_weight": 1.0}
    assert _makespan(make_schedule("1f1b", S, M), units) == 3 * M + 3 * (S - 1)
    zb = make_schedule("zb", S, M)
    assert _makespan(zb, units) == 3 * M + (S - 1)
    # Activations live from a microbatch's F to its W (B in 1F1B): no rank holds more than
    # 1F1B's peak, S.
    for order in zb.orders:
        live = peak = 0
        for instr in order:
            live += {"forward": 1, "backward_weight": -1}.get(instr.kind, 0)
            peak = max(peak, live)
        assert peak <= S


def test_dag_edges() -> None:
    s = make_schedule("1f1b", 2, 2)
    g = s.dag()
    F = lambda st, j: Instruction(st, "forward", j)  # noqa: E731
    B = lambda st, j: Instruction(st, "backward", j)  # noqa: E731
    assert set(g.edges) == {
        # same-stage order
        (F(0, 0), F(0, 1)),
        (F(0, 1), B(0, 0)),
        (B(0, 0), B(0, 1)),
        (F(1, 0), B(1, 0)),
        (B(1, 0), F(1, 1)),
        (F(1, 1), B(1, 1)),
        # forward flows down, backward flows up
        (F(0, 0), F(1, 0)),
        (F(0, 1), F(1, 1)),
        (B(1, 0), B(0, 0)),
        (B(1, 1), B(0, 1)),
    }
    assert nx.is_directed_acyclic_graph(g)


def test_split_backward_edges() -> None:
    s = make_schedule("zb", 2, 1)
    g = s.dag()
    F0, F1 = Instruction(0, "forward", 0), Instruction(1, "forward", 0)
    I0, I1 = Instruction(0, "backward_input", 0), Instruction(1, "backward_input", 0)
    W0, W1 = Instruction(0, "backward_weight", 0), Instruction(1, "backward_weight", 0)
    assert set(g.edges) == {
        (F0, I0),
        (I0, W0),
        (F1, I1),
        (I1, W1),  # each rank's order
        (F0, F1),
        (I1, I0),  # activations down, input gradients up
    }


@pytest.mark.parametrize("name", ["1f1b", "gpipe", "interleaved", "zb"])
@pytest.mark.parametrize(("S", "M"), [(1, 1), (2, 4), (4, 8), (3, 6)])
def test_every_instruction_once_and_acyclic(name: str, S: int, M: int) -> None:
    s = make_schedule(name, S, M, num_chunks=2)
    V = s.num_chunks
    kinds = (
        ("forward", "backward_input", "backward_weight")
        if name == "zb"
        else ("forward", "backward")
    )
    for rank, order in enumerate(s.orders):
        assert sorted(order) == sorted(
            Instruction(rank, k, j, c * S + rank) for k in kinds for j in range(M) for c in range(V)
        )
    assert nx.is_directed_acyclic_graph(s.dag())
    assert s.dag().number_of_nodes() == len(kinds) * S * M * V
    # The same orders, given explicitly, make the same schedule.
    again = PipelineSchedule.from_orders(name, s.actions(), M)
    assert again.orders == s.orders and set(again.dag().edges) == set(s.dag().edges)
    # The schedule sorts its DAG without networkx, in networkx's own order (the solver
    # numbers instructions in it) and lists the same edges in the same order.
    assert s.instructions() == list(nx.topological_sort(s.dag()))
    assert s.edges() == list(s.dag().edges())


def _looped(S: int, V: int, M: int) -> list[list[tuple[int, str, int]]]:
    """Looped BFS: every rank runs all forwards of its first stage, then of its next…"""
    return [
        [(c * S + r, "forward", j) for c in range(V) for j in range(M)]
        + [(c * S + r, "backward", j) for c in reversed(range(V)) for j in range(M)]
        for r in range(S)
    ]


def test_from_orders_takes_any_stage_to_rank_mapping() -> None:
    # V-shaped (as ZBV): rank r holds stages r and 2S-1-r.
    S, M = 2, 2
    orders = [
        [
            (0, "forward", 0),
            (0, "forward", 1),
            (3, "forward", 0),
            (3, "backward_input", 0),
            (3, "backward_weight", 0),
            (3, "forward", 1),
            (3, "backward", 1),
            (0, "backward", 0),
            (0, "backward_input", 1),
            (0, "backward_weight", 1),
        ],
        [
            (1, "forward", 0),
            (2, "forward", 0),
            (1, "forward", 1),
            (2, "backward", 0),
            (2, "forward", 1),
            (1, "backward", 0),
            (2, "backward", 1),
            (1, "backward", 1),
        ],
    ]
    s = PipelineSchedule.from_orders("zbv-like", orders, M)
    assert s.stage_ranks == (0, 1, 1, 0) and s.num_chunks == 2 and s.num_stages == S
    g = s.dag()
    assert g.has_edge(Instruction(1, "forward", 0, 2), Instruction(0, "forward", 0, 3))
    # A split backward's I feeds the full backward of the stage before it.
    assert g.has_edge(Instruction(0, "backward_input", 0, 3), Instruction(1, "backward", 0, 2))
    assert not s.builtin and make_schedule("1f1b", 2, 2).builtin
    looped = PipelineSchedule.from_orders("looped", _looped(2, 3, 2), 2)
    assert looped.stage_ranks == (0, 1, 0, 1, 0, 1)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda o: o[0].pop(), r"B1@s0 \(backward of microbatch 1 on stage 0\) is missing"),
        (lambda o: o[1].append((1, "forward", 0)), r"F0@s1 .* is repeated: rank 1 action #0"),
        # rank 0 waits for B0 before it sends F1: rank 1 then waits for F1 for ever.
        (
            lambda o: (
                o.__setitem__(
                    1,
                    [(1, "forward", 0), (1, "forward", 1), (1, "backward", 0), (1, "backward", 1)],
                )
                or o.__setitem__(
                    0,
                    [(0, "forward", 0), (0, "backward", 0), (0, "forward", 1), (0, "backward", 1)],
                )
            ),
            r"deadlocks: .* can never run",
        ),
        (lambda o: o[1].append((0, "backward_weight", 0)), r"rank 0 runs too"),
        (lambda o: o[0].append((0, "sideways", 0)), r"unknown instruction kind 'sideways'"),
        (lambda o: o[0].append((0, "forward", 7)), r"microbatch 7 is outside 0..1"),
        (lambda o: o[0].append((0, "backward_input", 1)), r"I1@s0 duplicates the backward B1@s0"),
    ],
)
def test_a_bad_order_is_refused_naming_the_instruction(change, message: str) -> None:
    orders = make_schedule("1f1b", 2, 2).actions()
    change(orders)
    with pytest.raises(ScheduleError, match=message):
        PipelineSchedule.from_orders("custom", orders, 2)


def test_a_split_backward_needs_both_halves() -> None:
    orders = make_schedule("zb", 2, 2).actions()
    orders[1] = [a for a in orders[1] if a != (1, "backward_weight", 1)]
    with pytest.raises(ScheduleError, match=r"W1@s1 \(weight gradient of microbatch 1"):
        PipelineSchedule.from_orders("custom", orders, 2)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("1f1b", 0, 4), "stages must be at least 1"),
        (("1f1b", 2, 0), "microbatches must be at least 1"),
        (("zigzag", 2, 2), "Unknown pipeline schedule"),
        (("interleaved", 3, 4), "multiple of the number of stages"),
    ],
)
def test_bad_schedule_parameters(args: tuple, message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        make_schedule(*args)


@pytest.mark.parametrize("name", ["1f1b", "gpipe", "interleaved"])
def test_a_schedule_too_big_is_refused_before_it_is_built(name: str) -> None:
    # Building 1.6·10¹⁰ instructions used to run until the kernel killed the process.
    with pytest.raises(ScheduleError, match=r"16,000,000,000 instructions; at most 1,048,576"):
        make_schedule(name, 8, 10**9, num_chunks=1)
