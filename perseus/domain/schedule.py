"""Pipeline schedules and the instruction DAG of one training iteration.

A schedule gives, for every pipeline rank (one GPU, or one tensor-parallel group), the
order in which it executes its instructions. An instruction is one computation of one
microbatch on one pipeline *stage*: the model is cut into stages ``0..N-1`` and each rank
holds one stage (1F1B, GPipe) or several (interleaved 1F1B and looped BFS hold stages
``r, r+S, r+2S, …``; ZBV holds a V: ``r`` and ``2S-1-r``). Instruction kinds:

- ``forward`` (F); ``backward`` (B, the full backward);
- ``backward_input`` (I) and ``backward_weight`` (W): a split backward, as zero-bubble
  schedules run it. I computes the input gradient the previous stage waits for; W the
  weight gradient nobody waits for.

The DAG has one node per instruction and these edges:

- each rank's own order: consecutive instructions of a rank;
- F(s, j) → F(s+1, j): activations flow down the pipeline;
- G(s+1, j) → G(s, j), where G is the B or the I of a stage: gradients flow back up;
- F(last, j) → G(last, j): the loss turns around;
- I(s, j) → W(s, j): the weight gradient needs the input gradient's intermediate results.

`PipelineSchedule.from_orders` builds a schedule from any per-rank order of
``(stage, kind, microbatch)`` actions and refuses, naming the instruction, an order that
misses, repeats or deadlocks on one. The built-in schedules (`make_schedule`) are orders
produced for that same mechanism:

- ``1f1b`` (synchronous, DeepSpeed/Megatron order): rank s runs min(S−s−1, M) warm-up
  forwards, then alternates forward/backward, then the remaining backwards.
- ``gpipe``: all forwards, then all backwards, in microbatch order.
- ``interleaved``: Megatron-LM's interleaved 1F1B with V stages per rank (M a multiple of S).
- ``zb``: ZB-H1 (Qi et al., 2024): 1F1B with every backward split into I and W, rank s
  deferring its W's by s microbatches so that they fill its bubbles (torch's order).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from perseus.domain.kinds import INSTRUCTIONS, SCHEDULES
from perseus.domain.orders import (
    MAX_ACTIONS,
    Action,
    builtin_orders,
    check_memory,
    check_size,
    instructions_per_stage,
    schedule_name,
)
from perseus.errors import ScheduleError

if TYPE_CHECKING:
    import networkx as nx

    from perseus.domain.profile import InstructionOptions, InstructionProfile

__all__ = [
    "MAX_ACTIONS",
    "SCHEDULES",
    "Instruction",
    "PipelineSchedule",
    "check_size",
    "instructions_per_stage",
    "make_schedule",
    "schedule_name",
]

_LETTER = {"forward": "F", "backward": "B", "backward_input": "I", "backward_weight": "W"}


@dataclass(frozen=True, order=True)
class Instruction:
    """One computation of one microbatch on one pipeline stage, run by one pipeline rank.

    `rank` is the pipeline rank (GPU) that runs it; `stage` the pipeline (virtual) stage,
    which is the rank itself unless the rank holds several stages (default: the rank).
    """

    rank: int
    kind: str
    microbatch: int
    stage: int = field(default=-1)

    def __post_init__(self) -> None:
        if self.stage < 0:
            object.__setattr__(self, "stage", self.rank)

    def __str__(self) -> str:
        where = f"s{self.stage}" if self.stage == self.rank else f"s{self.stage}/r{self.rank}"
        return f"{_LETTER.get(self.kind, self.kind)}{self.microbatch}@{where}"


@dataclass(frozen=True)
class PipelineSchedule:
    """Execution order of every pipeline rank for one iteration.

    Build with `make_schedule` (built-in schedules) or `from_orders` (any order).
    `num_stages` counts pipeline *ranks* (a plan has one frequency list per rank);
    `num_virtual_stages` counts the model's stages (``num_stages · num_chunks``).
    """

    name: str
    num_stages: int
    num_microbatches: int
    num_chunks: int
    orders: tuple[tuple[Instruction, ...], ...]
    stage_ranks: tuple[int, ...] = ()
    """Pipeline stage → the rank that holds it (default: stage s on rank s mod S)."""
    builtin: bool = False
    """Made by `make_schedule` (its name, stages, microbatches and chunks say it all)."""

    def __post_init__(self) -> None:
        if not self.stage_ranks:
            n = self.num_stages * self.num_chunks
            object.__setattr__(
                self, "stage_ranks", tuple(s % self.num_stages for s in range(n))
            )

    @property
    def num_virtual_stages(self) -> int:
        return len(self.stage_ranks)

    # ------------------------------------------------------------ construction
    @classmethod
    def from_orders(
        cls,
        name: str,
        orders: Sequence[Sequence[Action]],
        num_microbatches: int,
    ) -> PipelineSchedule:
        """A schedule from each pipeline rank's order of ``(stage, kind, microbatch)``.

        Raises `ScheduleError`, naming the instruction, when an order holds an unknown
        kind, a stage held by two ranks, a repeated or missing instruction, or one that
        can never run (the orders deadlock on it).
        """
        if not isinstance(num_microbatches, int) or num_microbatches < 1:
            raise ScheduleError(
                f"The number of microbatches must be at least 1, got {num_microbatches!r}"
            )
        if not orders:
            raise ScheduleError(f"The {name} schedule has no pipeline rank")
        total = sum(len(o) for o in orders)
        if total > MAX_ACTIONS:
            raise ScheduleError(
                f"The {name} schedule has {total:,} instructions; at most {MAX_ACTIONS:,} "
                "are supported"
            )
        check_memory(name, total, f"{len(orders):,} rank(s) × {num_microbatches:,} microbatch(es)")
        M = num_microbatches
        stage_rank: dict[int, int] = {}
        where: dict[Instruction, tuple[int, int]] = {}
        built: list[tuple[Instruction, ...]] = []
        for rank, order in enumerate(orders):
            row: list[Instruction] = []
            for pos, action in enumerate(order):
                try:
                    stage, kind, mb = action
                except (TypeError, ValueError):
                    raise ScheduleError(
                        f"Rank {rank}, action #{pos}: {action!r} is not (stage, kind, microbatch)"
                    ) from None
                if kind not in INSTRUCTIONS:
                    raise ScheduleError(
                        f"Rank {rank}, action #{pos}: unknown instruction kind {kind!r}; "
                        f"expected one of {', '.join(INSTRUCTIONS)}"
                    )
                if not isinstance(stage, int) or stage < 0:
                    raise ScheduleError(f"Rank {rank}, action #{pos}: bad stage {stage!r}")
                if not isinstance(mb, int) or not 0 <= mb < M:
                    raise ScheduleError(
                        f"Rank {rank}, action #{pos}: microbatch {mb!r} is outside 0..{M - 1}"
                    )
                instr = Instruction(rank, kind, mb, stage)
                held = stage_rank.setdefault(stage, rank)
                if held != rank:
                    raise ScheduleError(
                        f"Rank {rank}, action #{pos}: {instr} runs stage {stage}, which rank "
                        f"{held} runs too; every stage belongs to one rank"
                    )
                if instr in where:
                    r0, p0 = where[instr]
                    raise ScheduleError(
                        f"{instr} ({kind} of microbatch {mb} on stage {stage}) is repeated: "
                        f"rank {r0} action #{p0} and rank {rank} action #{pos}"
                    )
                where[instr] = (rank, pos)
                row.append(instr)
            built.append(tuple(row))
        S = len(built)
        N = max(stage_rank) + 1
        missing_stages = sorted(set(range(N)) - set(stage_rank))
        if missing_stages:
            raise ScheduleError(
                f"The {name} schedule runs no instruction of stage(s) {missing_stages}; stages "
                f"must be numbered 0..{N - 1}"
            )
        per_rank = [sum(1 for r in stage_rank.values() if r == rank) for rank in range(S)]
        if len(set(per_rank)) != 1:
            raise ScheduleError(
                f"The {name} schedule gives the ranks different numbers of stages ({per_rank}); "
                "every rank must hold as many stages as the others"
            )
        for s in range(N):
            r = stage_rank[s]
            for j in range(M):
                f = Instruction(r, "forward", j, s)
                if f not in where:
                    raise ScheduleError(f"{f} (forward of microbatch {j} on stage {s}) is missing")
                b = Instruction(r, "backward", j, s)
                i = Instruction(r, "backward_input", j, s)
                w = Instruction(r, "backward_weight", j, s)
                if b in where and (i in where or w in where):
                    extra = i if i in where else w
                    raise ScheduleError(
                        f"{extra} duplicates the backward {b}: a microbatch's backward on a "
                        "stage is either one B or one I and one W"
                    )
                if b not in where:
                    if i not in where:
                        raise ScheduleError(
                            f"{i if w in where else b} (backward of microbatch {j} on stage {s}) "
                            "is missing"
                        )
                    if w not in where:
                        raise ScheduleError(
                            f"{w} (weight gradient of microbatch {j} on stage {s}) is missing"
                        )
        sched = cls(
            name=name,
            num_stages=S,
            num_microbatches=M,
            num_chunks=per_rank[0],
            orders=tuple(built),
            stage_ranks=tuple(stage_rank[s] for s in range(N)),
        )
        sched._check_acyclic()
        return sched

    # ------------------------------------------------------------ the DAG
    @cached_property
    def _successors(self) -> dict[Instruction, dict[Instruction, None]]:
        """The DAG as ordered adjacency: every instruction, in the order networkx's
        `DiGraph` would hold it, mapped to its successors in edge order. Plain dicts, so
        that building and sorting a schedule (every solve) needs no networkx import."""
        succ: dict[Instruction, dict[Instruction, None]] = {}

        def edge(u: Instruction, v: Instruction) -> None:
            succ.setdefault(u, {})[v] = None
            succ.setdefault(v, {})

        for order in self.orders:
            for ins in order:
                succ.setdefault(ins, {})
            for u, v in itertools.pairwise(order):
                edge(u, v)
        ranks = self.stage_ranks
        N = len(ranks)
        present = succ.keys()
        for j in range(self.num_microbatches):
            for s in range(N):
                here, r = s, ranks[s]
                if s + 1 < N:
                    nxt = ranks[s + 1]
                    edge(Instruction(r, "forward", j, here), Instruction(nxt, "forward", j, s + 1))
                    up = _grad_node(present, nxt, j, s + 1)
                    edge(up, _grad_node(present, r, j, here))
                w = Instruction(r, "backward_weight", j, here)
                if w in present:
                    edge(Instruction(r, "backward_input", j, here), w)
            last = N - 1
            edge(
                Instruction(ranks[last], "forward", j, last),
                _grad_node(present, ranks[last], j, last),
            )
        return succ

    @cached_property
    def _generations(self) -> list[list[Instruction]] | None:
        """Kahn's topological generations, in networkx's order (`nx.topological_generations`
        on `dag()`); ``None`` when the graph has a cycle."""
        succ = self._successors
        indegree: dict[Instruction, int] = dict.fromkeys(succ, 0)
        for children in succ.values():
            for child in children:
                indegree[child] += 1
        zero = [v for v, d in indegree.items() if d == 0]
        waiting = {v: d for v, d in indegree.items() if d > 0}
        generations = []
        while zero:
            generation, zero = zero, []
            for node in generation:
                for child in succ[node]:
                    waiting[child] -= 1
                    if waiting[child] == 0:
                        zero.append(child)
                        del waiting[child]
            generations.append(generation)
        return None if waiting else generations

    def _check_acyclic(self) -> None:
        if self._generations is not None:
            return
        import networkx as nx  # only to name the cycle

        cycle = nx.find_cycle(self.dag())
        path = " → ".join(str(u) for u, _ in cycle) + f" → {cycle[0][0]}"
        first = cycle[0][0]
        raise ScheduleError(
            f"The {self.name} schedule deadlocks: {first} can never run, because each of "
            f"{path} waits for the next (a rank's own order or a pipeline dependency)"
        )

    def edges(self) -> list[tuple[Instruction, Instruction]]:
        """The DAG's edges (``dag().edges()``, in its order), without building the graph."""
        return [(u, v) for u, children in self._successors.items() for v in children]

    @cached_property
    def _dag(self) -> nx.DiGraph:
        import networkx as nx  # here, so that the wire protocol (and every rank) stays light

        g = nx.DiGraph()
        g.add_nodes_from(self._successors)
        g.add_edges_from(self.edges())
        return g

    def dag(self) -> nx.DiGraph:
        """The instruction DAG (nodes are `Instruction`s). Do not mutate it; it is cached."""
        return self._dag

    @cached_property
    def _topological_order(self) -> tuple[Instruction, ...]:
        self._check_acyclic()
        return tuple(itertools.chain.from_iterable(self._generations or ()))

    def instructions(self) -> list[Instruction]:
        """Every instruction, in a topological order of the DAG (computed once)."""
        return list(self._topological_order)

    @property
    def num_instructions(self) -> int:
        return sum(len(o) for o in self.orders)

    def kinds(self) -> list[list[str]]:
        """Per rank, the instruction kinds in execution order."""
        return [list(kinds) for kinds in self.kind_table]

    @cached_property
    def kind_table(self) -> tuple[tuple[str, ...], ...]:
        """`kinds`, built once (a plan of every frontier point lays its clocks beside it)."""
        return tuple(tuple(i.kind for i in order) for order in self.orders)

    def instruction_kinds(self) -> list[str]:
        """The kinds this schedule runs, in `INSTRUCTIONS` order."""
        used = {i.kind for order in self.orders for i in order}
        return [k for k in INSTRUCTIONS if k in used]

    def actions(self) -> list[list[Action]]:
        """Per rank, its order as ``(stage, kind, microbatch)`` (what `from_orders` takes)."""
        return [[(i.stage, i.kind, i.microbatch) for i in order] for order in self.orders]

    # ------------------------------------------------------------ profile mapping
    def check_profile(self, profile: InstructionProfile) -> None:
        """Raise `ScheduleError` unless the profile has every (stage, kind) this schedule
        runs: one profile stage per pipeline stage, or (with several stages per rank) one
        per rank, split evenly among its stages."""
        S, N = self.num_stages, self.num_virtual_stages
        if profile.num_stages == N:
            where = "stage"
        elif N != S and profile.num_stages == S:
            where = "rank"
        else:
            want = f"{N} or {S}" if N != S else f"{S}"
            raise ScheduleError(
                f"The profile has {profile.num_stages} stage(s) but the {self.name} schedule "
                f"has {N} pipeline stage(s) on {S} rank(s): expected a profile with {want} "
                f"stages (this profile fits a pipeline of {profile.num_stages} ranks)"
            )
        needed = {(getattr(i, where), i.kind) for order in self.orders for i in order}
        for key in sorted(needed):
            if not profile.has(*key):
                raise ScheduleError(
                    f"The {self.name} schedule runs {key[1]} on stage {key[0]}, but the profile "
                    f"{profile.source} has no {key[1]} rows for that stage"
                )

    def options(self, profile: InstructionProfile, instruction: Instruction) -> InstructionOptions:
        """The profiled options that apply to `instruction`.

        A profile with one stage per pipeline stage gives each its own numbers; a profile
        with one stage per rank is split evenly among the rank's `num_chunks` stages.
        """
        if profile.num_stages == self.num_virtual_stages:
            return profile.options(instruction.stage, instruction.kind)
        return profile.options(instruction.rank, instruction.kind).scaled(1.0 / self.num_chunks)


def _grad_node(present: Iterable[Instruction], rank: int, j: int, stage: int) -> Instruction:
    b = Instruction(rank, "backward", j, stage)
    return b if b in present else Instruction(rank, "backward_input", j, stage)


def make_schedule(
    name: str, num_stages: int, num_microbatches: int, *, num_chunks: int = 2
) -> PipelineSchedule:
    """Build a built-in pipeline schedule: ``"1f1b"``, ``"gpipe"``, ``"interleaved"`` or
    ``"zb"`` over `num_stages` pipeline ranks.

    `num_chunks` (stages per rank) is used by ``interleaved`` only.
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
    check_size(key, num_stages, num_microbatches, num_chunks=num_chunks)
    orders = builtin_orders(key, num_stages, num_microbatches, num_chunks)
    schedule = PipelineSchedule.from_orders(key, orders, num_microbatches)
    return dataclasses.replace(schedule, builtin=True)
