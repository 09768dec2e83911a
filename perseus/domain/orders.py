"""The built-in schedules' per-rank orders, their names and their size limits.

Each generator returns, per pipeline rank, the ``(stage, kind, microbatch)`` actions of one
iteration (`Action`); `perseus.domain.schedule.make_schedule` turns them into a checked
`PipelineSchedule`. The schedules themselves are described in that module's docstring.
"""

from __future__ import annotations

from perseus.domain.kinds import SCHEDULES
from perseus.errors import ScheduleError
from perseus.memory import memory_shortfall

__all__ = [
    "MAX_ACTIONS",
    "Action",
    "builtin_orders",
    "check_memory",
    "check_size",
    "instructions_per_stage",
    "schedule_name",
]

MAX_ACTIONS = 1 << 20
"""The most instructions one iteration's schedule may hold (about 1.2 GB with its DAG)."""

Action = tuple[int, str, int]
"""One entry of a rank's order: (stage, kind, microbatch)."""


def _one_f_one_b(S: int, M: int) -> list[list[Action]]:
    orders = []
    for s in range(S):
        warmup = min(S - s - 1, M)
        order: list[Action] = [(s, "forward", j) for j in range(warmup)]
        for i in range(M - warmup):
            order += [(s, "forward", warmup + i), (s, "backward", i)]
        order += [(s, "backward", j) for j in range(M - warmup, M)]
        orders.append(order)
    return orders


def _gpipe(S: int, M: int) -> list[list[Action]]:
    return [
        [(s, "forward", j) for j in range(M)] + [(s, "backward", j) for j in range(M)]
        for s in range(S)
    ]


def _zero_bubble_h1(S: int, M: int) -> list[list[Action]]:
    """ZB-H1: 1F1B's order with B split into I and W; rank s runs W(j) after I(j + s).

    The input gradients then run back up the pipeline without waiting for the W's, which
    fill each rank's idle time instead: on the ZB paper's uniform profile (T_F = T_I = T_W)
    the bubble shrinks from 1F1B's (S−1)(T_F+T_I+T_W) to (S−1)(T_F+T_I−T_W). Deferring by
    s keeps every rank's live activations at most S, 1F1B's peak (rank 0's). This is
    torch's ``ScheduleInterleavedZeroBubble`` order with one stage per rank."""
    orders = []
    for s, order_1f1b in enumerate(_one_f_one_b(S, M)):
        delay = min(s, M)
        order: list[Action] = []
        done_w = 0
        for stage, kind, j in order_1f1b:
            if kind == "forward":
                order.append((stage, kind, j))
                continue
            order.append((stage, "backward_input", j))
            if j >= delay:
                order.append((stage, "backward_weight", done_w))
                done_w += 1
        order += [(s, "backward_weight", j) for j in range(done_w, M)]
        orders.append(order)
    return orders


def _interleaved(S: int, M: int, V: int) -> list[list[Action]]:
    """Megatron-LM's interleaved 1F1B (`forward_backward_pipelining_with_interleaving`):
    rank s holds stages s, s+S, …, s+(V-1)S."""
    if M % S != 0:
        raise ScheduleError(
            f"Interleaved 1F1B needs the number of microbatches ({M}) to be a multiple of the "
            f"number of stages ({S})"
        )
    total = M * V

    def chunk_of(k: int, forward: bool) -> int:
        c = (k % (S * V)) // S
        return c if forward else V - 1 - c

    def microbatch_of(k: int) -> int:
        return (k // (S * V)) * S + k % S

    orders = []
    for s in range(S):
        warmup = total if M == S else min((S - s - 1) * 2 + (V - 1) * S, total)
        fwd: list[Action] = [
            (chunk_of(k, True) * S + s, "forward", microbatch_of(k)) for k in range(total)
        ]
        bwd: list[Action] = [
            (chunk_of(k, False) * S + s, "backward", microbatch_of(k)) for k in range(total)
        ]
        order = fwd[:warmup]
        for k in range(total - warmup):
            order += [fwd[warmup + k], bwd[k]]
        order += bwd[total - warmup :]
        orders.append(order)
    return orders


def schedule_name(name: str) -> str:
    """The canonical name (``"1f1b"``, ``"gpipe"``, ``"interleaved"`` or ``"zb"``) of a
    schedule name as users write it (any case, with or without ``-``/``_``,
    ``interleaved-1f1b``, ``zb-h1``)."""
    key = name.lower().replace("-", "").replace("_", "")
    key = {"interleaved1f1b": "interleaved", "zbh1": "zb", "zerobubble": "zb"}.get(key, key)
    if key not in SCHEDULES:
        raise ScheduleError(
            f"Unknown pipeline schedule {name!r}; choose one of {', '.join(SCHEDULES)}"
        )
    return key


def instructions_per_stage(name: str, num_microbatches: int, num_chunks: int = 2) -> int:
    """Instructions each rank runs in a built-in schedule: a forward and a backward (an I
    and a W for ``zb``) of every microbatch, per stage it holds (``num_chunks`` counts for
    ``interleaved`` only)."""
    key = schedule_name(name)
    chunks = num_chunks if key == "interleaved" else 1
    return (3 if key == "zb" else 2) * num_microbatches * chunks


_BYTES_PER_INSTRUCTION = 1200
"""Memory of one instruction in a schedule (~160 B) plus its networkx DAG (~1 KB), measured."""


def check_memory(name: str, count: int, shape: str) -> None:
    short = memory_shortfall(
        count * _BYTES_PER_INSTRUCTION,
        f"The {name} schedule of {shape} ({count:,} instructions, with its DAG)",
    )
    if short:
        raise ScheduleError(f"{short}; use fewer stages or microbatches")


def check_size(name: str, num_stages: int, num_microbatches: int, *, num_chunks: int = 2) -> None:
    """Raise `ScheduleError` when a built-in schedule of this shape would be too big to
    build (more than `MAX_ACTIONS` instructions, or more than the memory available)."""
    key = schedule_name(name)
    count = num_stages * instructions_per_stage(key, num_microbatches, num_chunks)
    shape = f"{num_stages:,} stage(s) × {num_microbatches:,} microbatch(es)"
    if count > MAX_ACTIONS:
        raise ScheduleError(
            f"The {key} schedule of {shape} has {count:,} instructions; at most "
            f"{MAX_ACTIONS:,} are supported"
        )
    check_memory(key, count, shape)


def builtin_orders(
    name: str, num_stages: int, num_microbatches: int, num_chunks: int = 2
) -> list[list[Action]]:
    """The per-rank orders of built-in schedule `name` (a canonical `schedule_name`)."""
    if name == "interleaved":
        return _interleaved(num_stages, num_microbatches, num_chunks)
    if name == "zb":
        return _zero_bubble_h1(num_stages, num_microbatches)
    if name == "1f1b":
        return _one_f_one_b(num_stages, num_microbatches)
    return _gpipe(num_stages, num_microbatches)
