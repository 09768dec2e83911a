"""Pipeline schedules and the instruction DAG of one training iteration.

A schedule gives, for every pipeline stage (one GPU, or one tensor-parallel group), the
order in which it executes its instructions: the forward and backward of each microbatch
(and, for interleaved 1F1B, of each of its model chunks). The DAG has one node per
instruction and these edges:

- same-stage order: consecutive instructions of a stage;
- forward(s, j) → forward(s+1, j): activations flow down the pipeline;
- backward(s+1, j) → backward(s, j): gradients flow back up;
- forward(last, j) → backward(last, j): the loss turns around (also implied by the order).

For interleaved 1F1B the "next stage" of chunk c on stage S-1 is chunk c+1 on stage 0: the
model is cut into S·V pieces, piece k living on stage k mod S as chunk k div S.

Schedules:

- ``1f1b`` (synchronous, DeepSpeed/Megatron order): stage s runs min(S−s−1, M) warm-up
  forwards, then alternates forward/backward, then the remaining backwards.
- ``gpipe``: all forwards, then all backwards, in microbatch order.
- ``interleaved``: Megatron-LM's interleaved 1F1B with V chunks per stage (M a multiple of S).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Literal

import networkx as nx

from perseus.domain.kinds import SCHEDULES
from perseus.errors import ScheduleError
from perseus.memory import memory_shortfall

if TYPE_CHECKING:
    from perseus.domain.profile import InstructionOptions, InstructionProfile

__all__ = [
    "SCHEDULES",
    "Instruction",
    "PipelineSchedule",
    "instructions_per_stage",
    "make_schedule",
    "schedule_name",
]

Kind = Literal["forward", "backward"]


@dataclass(frozen=True, order=True)
class Instruction:
    """One forward or backward of one microbatch (and model chunk) on one pipeline stage."""

    stage: int
    kind: Kind
    microbatch: int
    chunk: int = 0

    def __str__(self) -> str:
        letter = "F" if self.kind == "forward" else "B"
        chunk = f".c{self.chunk}" if self.chunk else ""
        return f"{letter}{self.microbatch}@s{self.stage}{chunk}"


@dataclass(frozen=True)
class PipelineSchedule:
    """Execution order of every stage for one iteration. Build with `make_schedule`."""

    name: str
    num_stages: int
    num_microbatches: int
    num_chunks: int
    orders: tuple[tuple[Instruction, ...], ...]

    @cached_property
    def _dag(self) -> nx.DiGraph:
        g = nx.DiGraph()
        for order in self.orders:
            g.add_nodes_from(order)
            g.add_edges_from(itertools.pairwise(order))
        S, V = self.num_stages, self.num_chunks
        last_piece = S * V - 1
        for j in range(self.num_microbatches):
            for piece in range(last_piece):
                here = (piece % S, piece // S)
                there = ((piece + 1) % S, (piece + 1) // S)
                g.add_edge(
                    Instruction(here[0], "forward", j, here[1]),
                    Instruction(there[0], "forward", j, there[1]),
                )
                g.add_edge(
                    Instruction(there[0], "backward", j, there[1]),
                    Instruction(here[0], "backward", j, here[1]),
                )
            s, c = last_piece % S, last_piece // S
            g.add_edge(Instruction(s, "forward", j, c), Instruction(s, "backward", j, c))
        if not nx.is_directed_acyclic_graph(g):  # pragma: no cover - an internal invariant
            raise ScheduleError(f"{self.name} schedule produced a cyclic instruction graph")
        return g

    def dag(self) -> nx.DiGraph:
        """The instruction DAG (nodes are `Instruction`s). Do not mutate it; it is cached."""
        return self._dag

    @cached_property
    def _topological_order(self) -> tuple[Instruction, ...]:
        return tuple(nx.topological_sort(self._dag))

    def instructions(self) -> list[Instruction]:
        """Every instruction, in a topological order of the DAG (computed once)."""
        return list(self._topological_order)

    @property
    def num_instructions(self) -> int:
        return sum(len(o) for o in self.orders)

    def kinds(self) -> list[list[str]]:
        """Per stage, the instruction names ("forward"/"backward") in execution order."""
        return [[i.kind for i in order] for order in self.orders]

    # ------------------------------------------------------------ profile mapping
    def check_profile(self, profile: InstructionProfile) -> None:
        """Raise `ScheduleError` unless the profile's stage count fits this schedule."""
        S, V = self.num_stages, self.num_chunks
        allowed = {S, S * V} if self.name == "interleaved" else {S}
        if profile.num_stages not in allowed:
            want = f"{S} or {S * V}" if self.name == "interleaved" else f"{S}"
            raise ScheduleError(
                f"The profile has {profile.num_stages} stage(s) but the {self.name} schedule "
                f"has {S} stage(s): expected a profile with {want} stages (pass --stages "
                f"{profile.num_stages} to use this profile as is)"
            )

    def options(self, profile: InstructionProfile, instruction: Instruction) -> InstructionOptions:
        """The profiled options that apply to `instruction`.

        For interleaved 1F1B, a profile with S·V stages gives each model chunk its own
        numbers; a profile with S stages is split evenly among a stage's V chunks.
        """
        if self.name == "interleaved" and self.num_chunks > 1:
            if profile.num_stages == self.num_stages * self.num_chunks:
                return profile.options(
                    instruction.chunk * self.num_stages + instruction.stage, instruction.kind
                )
            return profile.options(instruction.stage, instruction.kind).scaled(
                1.0 / self.num_chunks
            )
        return profile.options(instruction.stage, instruction.kind)


def _one_f_one_b(S: int, M: int) -> list[list[Instruction]]:
    orders = []
    for s in range(S):
        warmup = min(S - s - 1, M)
        order = [Instruction(s, "forward", j) for j in range(warmup)]
        for i in range(M - warmup):
            order += [Instruction(s, "forward", warmup + i), Instruction(s, "backward", i)]
        order += [Instruction(s, "backward", j) for j in range(M - warmup, M)]
        orders.append(order)
    return orders


def _gpipe(S: int, M: int) -> list[list[Instruction]]:
    return [
        [Instruction(s, "forward", j) for j in range(M)]
        + [Instruction(s, "backward", j) for j in range(M)]
        for s in range(S)
    ]


def _interleaved(S: int, M: int, V: int) -> list[list[Instruction]]:
    """Megatron-LM's interleaved 1F1B (`forward_backward_pipelining_with_interleaving`)."""
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
        fwd = [Instruction(s, "forward", microbatch_of(k), chunk_of(k, True)) for k in range(total)]
        bwd = [
            Instruction(s, "backward", microbatch_of(k), chunk_of(k, False)) for k in range(total)
        ]
        order = fwd[:warmup]
        for k in range(total - warmup):
            order += [fwd[warmup + k], bwd[k]]
        order += bwd[total - warmup :]
        orders.append(order)
    return orders


def schedule_name(name: str) -> str:
    """The canonical name (``"1f1b"``, ``"gpipe"`` or ``"interleaved"``) of a schedule name
    as users write it (any case, with or without ``-``/``_``, ``interleaved-1f1b``)."""
    key = name.lower().replace("-", "").replace("_", "")
    key = {"interleaved1f1b": "interleaved"}.get(key, key)
    if key not in SCHEDULES:
        raise ScheduleError(
            f"Unknown pipeline schedule {name!r}; choose one of {', '.join(SCHEDULES)}"
        )
    return key


def instructions_per_stage(name: str, num_microbatches: int, num_chunks: int = 2) -> int:
    """Instructions each stage runs: a forward and a backward of every microbatch, per
    model chunk (``num_chunks`` counts for ``interleaved`` only)."""
    chunks = num_chunks if schedule_name(name) == "interleaved" else 1
    return 2 * num_microbatches * chunks


_BYTES_PER_INSTRUCTION = 1200
"""Memory of one instruction in a schedule (~160 B) plus its networkx DAG (~1 KB), measured."""


def make_schedule(
    name: str, num_stages: int, num_microbatches: int, *, num_chunks: int = 2
) -> PipelineSchedule:
    """Build a pipeline schedule: ``"1f1b"``, ``"gpipe"`` or ``"interleaved"``.

    `num_chunks` (virtual stages per stage) is used by ``interleaved`` only.
    """
    key = schedule_name(name)
    if not isinstance(num_stages, int) or num_stages < 1:
        raise ScheduleError(f"The number of stages must be at least 1, got {num_stages!r}")
    if not isinstance(num_microbatches, int) or num_microbatches < 1:
        raise ScheduleError(
            f"The number of microbatches must be at least 1, got {num_microbatches!r}"
        )
    if key == "interleaved" and num_chunks < 1:
        raise ScheduleError(f"The number of chunks must be at least 1, got {num_chunks!r}")
    count = num_stages * instructions_per_stage(key, num_microbatches, num_chunks)
    short = memory_shortfall(
        count * _BYTES_PER_INSTRUCTION,
        f"The {key} schedule of {num_stages:,} stage(s) × {num_microbatches:,} microbatch(es) "
        f"({count:,} instructions, with its DAG)",
    )
    if short:
        raise ScheduleError(f"{short}; use fewer stages or microbatches")
    if key == "interleaved":
        orders = _interleaved(num_stages, num_microbatches, num_chunks)
        chunks = num_chunks
    else:
        orders = (
            _one_f_one_b(num_stages, num_microbatches)
            if key == "1f1b"
            else _gpipe(num_stages, num_microbatches)
        )
        chunks = 1
    return PipelineSchedule(
        name=key,
        num_stages=num_stages,
        num_microbatches=num_microbatches,
        num_chunks=chunks,
        orders=tuple(tuple(o) for o in orders),
    )
