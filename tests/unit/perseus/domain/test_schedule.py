"""Pipeline schedules checked by hand, and the DAG's edges."""

from __future__ import annotations

import networkx as nx
import pytest

from perseus.domain.schedule import Instruction, make_schedule
from perseus.errors import ScheduleError


def _names(order: tuple[Instruction, ...]) -> str:
    return " ".join(f"{'F' if i.kind == 'forward' else 'B'}{i.microbatch}" for i in order)


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
        "F0@s0 F1@s0 F0@s0.c1 F1@s0.c1 F2@s0 B0@s0.c1 F3@s0 B1@s0.c1 "
        "F2@s0.c1 B0@s0 F3@s0.c1 B1@s0 B2@s0.c1 B3@s0.c1 B2@s0 B3@s0",
        "F0@s1 F1@s1 F0@s1.c1 B0@s1.c1 F1@s1.c1 B1@s1.c1 F2@s1 B0@s1 "
        "F3@s1 B1@s1 F2@s1.c1 B2@s1.c1 F3@s1.c1 B3@s1.c1 B2@s1 B3@s1",
    ]


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


@pytest.mark.parametrize("name", ["1f1b", "gpipe", "interleaved"])
@pytest.mark.parametrize(("S", "M"), [(1, 1), (2, 4), (4, 8), (3, 6)])
def test_every_instruction_once_and_acyclic(name: str, S: int, M: int) -> None:
    s = make_schedule(name, S, M, num_chunks=2)
    V = s.num_chunks
    for stage, order in enumerate(s.orders):
        assert sorted(order) == sorted(
            Instruction(stage, k, j, c)
            for k in ("forward", "backward")
            for j in range(M)
            for c in range(V)
        )
    assert nx.is_directed_acyclic_graph(s.dag())
    assert s.dag().number_of_nodes() == 2 * S * M * V


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
def test_a_schedule_too_big_for_memory_is_refused_before_it_is_built(name: str) -> None:
    # Building 1.6·10¹⁰ instructions used to run until the kernel killed the process.
    with pytest.raises(ScheduleError, match=r"16,000,000,000 instructions.* GiB of memory"):
        make_schedule(name, 8, 10**9, num_chunks=1)
