"""In-job fan-out: the job's leaders talk to the coordinator, every other rank hears from its own.

Protocol 2 (`perseus.protocol.PROTOCOL_VERSION`); `perseus.domain.layout.Leaders` says who
leads: in every pipeline stage, the tensor-rank-0 process of the first replica of each block
of data-parallel replicas (one block by default, so one leader per stage). `JobFanOut` is
built once on every rank when the hook is constructed, with collective calls made in the
same order on every rank:

1. **The job's table.** One ``all_gather`` of a fixed row per rank: its coordinates, the
   layout, leaders per stage, steps per round and pipeline it was given, its GPU's name,
   SM clocks and emulation, its measured clock-switch latency. Every rank learns where
   every other one sits without assuming how the launcher numbered them, and checks the
   table alike: one layout and one pipeline for all, coordinates that occur once, and one
   GPU type with one set of SM clocks everywhere (Perseus plans one list of clocks for all
   copies of a stage): otherwise a `ConfigurationError` naming the ranks that differ, on
   every rank, before anything talks to the coordinator.
2. **Groups in two levels.** A leader's group (its block's replicas × every tensor rank
   of its stage) talks through two kinds of ``torch.distributed.new_group``, created for
   every stage and block in the same order on every rank: the block's *replica heads* (each
   replica's tensor-rank-0 process; the leader is the first), and each replica's *tensor
   ranks*. Always gloo on CPU tensors, whatever backend trains, so this traffic stays off
   the training's NCCL streams; a group of one rank is not made (dp = tp = 1: no group,
   no collective).

Each round, on the hook's exchange thread (off the training thread):

- `JobFanOut.gather`: every rank sends its round (a float64 vector laid out the same on
  every rank, `GroupFold`) to its replica head, and the heads send their replica's vectors
  to the leader: two ``gather`` calls, each one hop, so the leader receives one message
  per replica of its block and a head one per tensor rank (a ring reduce over the group
  would take 2n sequential steps). The leader folds the rows: per iteration the slowest
  GPU's time and the group's energy; per instruction the slowest GPU's time and the
  energy of the tensor ranks of its own replica; per replica its slowest tensor rank's
  iteration time, its busiest tensor rank's instruction time, its energy; and the median
  blocking power of the idle GPUs. It gets one `ProfilingResult` that speaks for the group
  (`ProfilingResult.replicas`, `ProfilingResult.idle_power_w`).
- `JobFanOut.hand_out` / `JobFanOut.receive`: the leader broadcasts the schedule the
  coordinator gave it (JSON, the round number in a header; the error instead when it got
  none) to the heads, each head to its tensor ranks (binomial trees: ⌈log2⌉ hops each), and
  every rank checks that it is for the round it is about to run and runs its replica's
  list (`FrequencySchedule.frequencies_for`). No rank ever runs a schedule its leader did
  not hand out for that round.

`mesh_place` reads a rank's place from a ``torch.distributed.DeviceMesh``.
"""

from __future__ import annotations

import datetime
import hashlib
import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from perseus.client.bootstrap import share_job_id
from perseus.errors import ConfigurationError, CoordinatorError, RankError, ScheduleError
from perseus.protocol import (
    INSTRUCTIONS,
    FrequencySchedule,
    Leaders,
    ParallelLayout,
    ProfilingResult,
    ReplicaFigures,
)

__all__ = ["GroupFold", "JobFanOut", "MeshPlace", "mesh_place"]

_FIELDS = (
    "rank",
    "dp_rank",
    "pp_rank",
    "tp_rank",
    "dp_degree",
    "pp_degree",
    "tp_degree",
    "per_stage",
    "steps_per_round",
    "pipeline_hash",
    "emulated",
    "clocks",
    "min_mhz",
    "max_mhz",
    "clocks_hash",
    "switch_ns",
)
_NAME_BYTES = 64
_ROW = len(_FIELDS) + _NAME_BYTES // 8
_SHOWN = 8
"""Kinds of GPU (or layouts) shown in an error; the rest are counted."""


def _ranks_text(ranks: Sequence[int]) -> str:
    """``[0, 2-5, 9]``: sorted ranks with consecutive runs collapsed."""
    parts: list[str] = []
    ordered = sorted(ranks)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return "[" + ", ".join(parts) + "]"


def _hash63(text: str) -> int:
    """A stable 63-bit hash of `text` (fits an int64)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 1


@dataclass(frozen=True)
class _Row:
    """One rank's row of the job's table."""

    rank: int
    dp_rank: int
    pp_rank: int
    tp_rank: int
    dp_degree: int
    pp_degree: int
    tp_degree: int
    per_stage: int
    steps_per_round: int
    pipeline_hash: int
    emulated: int
    clocks: int
    min_mhz: int
    max_mhz: int
    clocks_hash: int
    switch_ns: int
    name: str

    def gpu(self) -> str:
        kind = self.name or "an unnamed GPU"
        if self.emulated and "emulated" not in kind:
            kind += " (emulated)"
        return f"{kind} with {self.clocks} SM clocks, {self.min_mhz}–{self.max_mhz} MHz"

    def layout(self) -> str:
        return (
            f"dp {self.dp_degree} × pp {self.pp_degree} × tp {self.tp_degree}, "
            f"{self.per_stage} leader(s) per stage, {self.steps_per_round} step(s) per round"
        )


def _differ(
    rows: Sequence[_Row], key: Callable[[_Row], Any], describe: Callable[[_Row], str]
) -> str | None:
    """None when every row has the same `key`; else the kinds, the most common first, each
    with its ranks."""
    kinds: dict[Any, list[_Row]] = {}
    for row in rows:
        kinds.setdefault(key(row), []).append(row)
    if len(kinds) < 2:
        return None
    ordered = sorted(kinds.values(), key=lambda group: (-len(group), group[0].rank))
    text = "; ".join(
        f"rank(s) {_ranks_text([r.rank for r in group])}: {describe(group[0])}"
        for group in ordered[:_SHOWN]
    )
    if len(ordered) > _SHOWN:
        text += f"; and {len(ordered) - _SHOWN} more kind(s)"
    return text


@dataclass(frozen=True)
class MeshPlace:
    """A rank's place read from a `DeviceMesh` (`mesh_place`)."""

    dp_rank: int
    dp_degree: int
    pp_rank: int
    pp_degree: int
    tp_rank: int
    tp_degree: int


_PP_NAMES = ("pp", "pipeline")
_TP_NAMES = ("tp", "tensor")


def mesh_place(mesh: Any) -> MeshPlace:
    """This rank's (dp, pp, tp) coordinates and degrees from a named `DeviceMesh`.

    The dimension named ``pp`` (or ``pipeline``) is the pipeline, ``tp`` (or ``tensor``)
    the tensor-parallel one; every other dimension (``dp``, ``dp_replicate``, ``dp_shard``,
    ``cp``, ...) runs the same pipeline on other data, so together, in the mesh's order,
    they make the data-parallel coordinate. A mesh without names, or with two pipeline or
    tensor dimensions, is a `ConfigurationError`.
    """
    names = getattr(mesh, "mesh_dim_names", None)
    if not names:
        raise ConfigurationError(
            "device_mesh has no dimension names: build it with names, e.g. "
            "init_device_mesh('cuda', (pp, dp, tp), mesh_dim_names=('pp', 'dp', 'tp'))"
        )
    sizes = [int(mesh.size(i)) for i in range(len(names))]
    coords = [int(mesh.get_local_rank(name)) for name in names]
    pp = [i for i, n in enumerate(names) if n in _PP_NAMES]
    tp = [i for i, n in enumerate(names) if n in _TP_NAMES]
    for role, found in (("pipeline", pp), ("tensor-parallel", tp)):
        if len(found) > 1:
            raise ConfigurationError(
                f"device_mesh names {len(found)} {role} dimensions "
                f"({', '.join(names[i] for i in found)}); name one"
            )
    dp_rank, dp_degree = 0, 1
    for i in range(len(names)):
        if i not in pp and i not in tp:
            dp_rank, dp_degree = dp_rank * sizes[i] + coords[i], dp_degree * sizes[i]
    return MeshPlace(
        dp_rank=dp_rank,
        dp_degree=dp_degree,
        pp_rank=coords[pp[0]] if pp else 0,
        pp_degree=sizes[pp[0]] if pp else 1,
        tp_rank=coords[tp[0]] if tp else 0,
        tp_degree=sizes[tp[0]] if tp else 1,
    )


class GroupFold:
    """How one group's round folds into its leader's `ProfilingResult` (`JobFanOut.gather`).

    Every rank of the group turns its own result into one float64 vector of a fixed layout
    (`contribution`): a check of the round's shape, its replica, its mean iteration time, its
    per-iteration instruction time (busy), its mean iteration energy, its blocking power (−1:
    never idle), then each instruction's time and energy and each iteration's time and
    energy. The leader gathers them (one ``gather``: every member sends once, the leader
    receives them side by side, so the depth does not grow with the group) and reads the
    group's result off the rows (`decode`): per instruction the slowest member's time and the
    summed energy of the members of its own replica (its tensor ranks), per iteration the
    slowest member's time and every member's energy, per replica its slowest member's mean
    iteration time, its busiest member's busy time and its members' energy, and the median
    blocking power of the members that were idle.

    Args:
        leader: The leader's global rank.
        members: The group's global ranks, ascending (the gather's row order).
        replicas: The data-parallel replicas the leader speaks for.
    """

    _HEAD = 6

    def __init__(self, *, leader: int, members: Sequence[int], replicas: range) -> None:
        self.leader = leader
        self.members = list(members)
        self.replicas = replicas

    @staticmethod
    def _shape(result: ProfilingResult) -> list[tuple[str, list[int]]]:
        kinds = [k for k in INSTRUCTIONS if k in result.time_breakdown]
        return [(k, [len(it) for it in result.time_breakdown[k]]) for k in kinds]

    def contribution(self, result: ProfilingResult, *, dp_rank: int) -> np.ndarray:
        """One member's vector (see the class docstring)."""
        shape = self._shape(result)
        times = [x for k, _ in shape for it in result.time_breakdown[k] for x in it]
        energies = [x for k, _ in shape for it in result.energy_breakdown.get(k, []) for x in it]
        if len(energies) != len(times):
            energies = [0.0] * len(times)
        n, iters = len(times), len(result.iter_time)
        busy_s = math.fsum(times) / iters
        time_s = math.fsum(result.iter_time) / iters
        energy_j = math.fsum(result.iter_energy) / iters
        idle_s = time_s - busy_s
        idle_w = -1.0
        if idle_s > 1e-6 * max(time_s, 1e-12):
            idle_w = max(0.0, (energy_j - math.fsum(energies) / iters) / idle_s)
        check = float(zlib.crc32(repr((shape, iters)).encode()))
        h = self._HEAD
        row = np.empty(h + 2 * n + 2 * iters)
        row[:h] = (check, dp_rank, time_s, busy_s, energy_j, idle_w)
        row[h : h + n] = times
        row[h + n : h + 2 * n] = energies
        row[h + 2 * n : h + 2 * n + iters] = result.iter_time
        row[h + 2 * n + iters :] = result.iter_energy
        return row

    def decode(self, rows: np.ndarray, own: ProfilingResult) -> ProfilingResult:
        """The leader's folded result from the members' vectors (one row each; `own`: its
        own result, for the shape). `RankError` when the rounds had different shapes."""
        shape = self._shape(own)
        n = sum(sum(lengths) for _, lengths in shape)
        iters = len(own.iter_time)
        h = self._HEAD
        if rows.shape != (len(self.members), h + 2 * n + 2 * iters) or np.any(
            rows[:, 0] != rows[0, 0]
        ):
            raise RankError(
                f"Rank {self.leader} (a stage leader, replicas "
                f"{_ranks_text(list(self.replicas))}): the ranks of its group "
                f"{_ranks_text(self.members)} measured rounds of different shapes; every rank "
                "of a stage must run the same instructions and steps per round"
            )
        dp = rows[:, 1].round().astype(int)
        own_replica = rows[dp == self.replicas.start]
        folded_t = rows[:, h : h + n].max(axis=0).tolist()
        folded_e = own_replica[:, h + n : h + 2 * n].sum(axis=0).tolist()
        time_breakdown: dict[str, list[list[float]]] = {}
        energy_breakdown: dict[str, list[list[float]]] = {}
        i = 0
        for kind, lengths in shape:
            time_breakdown[kind], energy_breakdown[kind] = [], []
            for length in lengths:
                time_breakdown[kind].append(folded_t[i : i + length])
                energy_breakdown[kind].append(folded_e[i : i + length])
                i += length
        replicas = []
        for d in self.replicas:
            mine = rows[dp == d]
            if not len(mine):
                raise RankError(f"Rank {self.leader}: no member of its group ran replica {d}")
            replicas.append(
                ReplicaFigures(
                    dp_rank=d,
                    iter_time_s=float(mine[:, 2].max()),
                    busy_s=float(mine[:, 3].max()),
                    energy_j=float(mine[:, 4].sum()),
                )
            )
        idle = rows[:, 5][rows[:, 5] >= 0]
        return ProfilingResult(
            rank=self.leader,
            iter_time=rows[:, h + 2 * n : h + 2 * n + iters].max(axis=0).tolist(),
            iter_energy=rows[:, h + 2 * n + iters :].sum(axis=0).tolist(),
            time_breakdown=time_breakdown,  # type: ignore[arg-type]
            energy_breakdown=energy_breakdown if own.energy_breakdown else {},  # type: ignore[arg-type]
            replicas=replicas,
            idle_power_w=float(np.median(idle)) if len(idle) else None,
            energy_windows=own.energy_windows,  # its own GPU's (schedulers.parallel)
        )

    def fold(
        self, results: Mapping[int, ProfilingResult], dp_ranks: Mapping[int, int]
    ) -> ProfilingResult:
        """The leader's result from every member's (global rank → result, → dp rank), as
        the gather delivers them: for simulations and tests of whole jobs."""
        rows = np.stack([self.contribution(results[m], dp_rank=dp_ranks[m]) for m in self.members])
        return self.decode(rows, results[self.leader])


class JobFanOut:
    """This rank's part in the job's fan-out (module docstring): the table, its leader and
    its group. Collective: construct it on every rank, in the same order as the other
    collective calls.

    Args:
        dist: ``torch.distributed``, initialised.
        rank, dp_rank, pp_rank, tp_rank: This process's place.
        layout: The job's layout.
        per_stage: Leaders per pipeline stage.
        steps_per_round: Iterations per round (equal on every rank, checked).
        pipeline_key: Text that identifies the pipeline this rank was given (equal on every
            rank, checked).
        gpu_name, frequencies, emulated, switch_latency_s: This rank's GPU.
        timeout_s: How long a collective of the fan-out may wait (a follower waits for its
            leader's whole exchange with the coordinator).

    Attributes:
        leaders: The rule.
        leader: The global rank of this rank's leader (itself, when it leads).
        registrar: The global rank that registers the job (the first leader).
        replicas: The replicas this rank's leader speaks for.
        members: The global ranks of this rank's group (every rank its leader speaks for),
            ascending.
        head: The global rank of this rank's replica head (its tensor-rank-0 process).
        switch_latency_s: The slowest measured clock switch of the group (None: none).
    """

    def __init__(
        self,
        dist: Any,
        *,
        rank: int,
        dp_rank: int,
        pp_rank: int,
        tp_rank: int,
        layout: ParallelLayout,
        per_stage: int,
        steps_per_round: int,
        pipeline_key: str,
        gpu_name: str,
        frequencies: Sequence[int],
        emulated: bool,
        switch_latency_s: float | None,
        timeout_s: float,
    ) -> None:
        import torch

        self._dist = dist
        self.rank = rank
        self.dp_rank, self.pp_rank, self.tp_rank = dp_rank, pp_rank, tp_rank
        self._timeout = datetime.timedelta(seconds=timeout_s)
        self._control = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
        """The gloo group over the whole job (None: the default group is gloo already)."""
        world = layout.world_size
        clocks = sorted(frequencies)
        name = gpu_name.encode()[:_NAME_BYTES].ljust(_NAME_BYTES, b"\0")
        mine = torch.zeros(_ROW, dtype=torch.int64)
        mine[: len(_FIELDS)] = torch.tensor(
            [
                rank,
                dp_rank,
                pp_rank,
                tp_rank,
                layout.dp_degree,
                layout.pp_degree,
                layout.tp_degree,
                per_stage,
                steps_per_round,
                _hash63(pipeline_key),
                int(emulated),
                len(clocks),
                clocks[0] if clocks else 0,
                clocks[-1] if clocks else 0,
                _hash63(",".join(map(str, clocks))),
                -1 if switch_latency_s is None else round(switch_latency_s * 1e9),
            ],
            dtype=torch.int64,
        )
        mine[len(_FIELDS) :] = torch.frombuffer(bytearray(name), dtype=torch.int64)
        gathered = [torch.zeros(_ROW, dtype=torch.int64) for _ in range(world)]
        dist.all_gather(gathered, mine, group=self._control)
        rows = [self._row(t) for t in gathered]
        self._check(rows)
        # After the table: a bad leaders_per_stage given to every rank fails every rank here,
        # one given to some ranks only is a layout the table shows to differ.
        self.leaders = Leaders(layout, per_stage)
        by_place = {(r.dp_rank, r.pp_rank, r.tp_rank): r for r in rows}
        tp_ranks = range(layout.tp_degree)
        self._heads: Any = None
        """The gloo group of this leader's replica heads (tensor rank 0 of each replica of
        its block), if this rank is one of them and there are several."""
        self._tensor: Any = None
        """The gloo group of this rank's replica's tensor ranks, if there are several."""
        self.head = by_place[dp_rank, pp_rank, 0].rank
        self.members: list[int] = [rank]
        self.leader = rank
        self.replicas = range(dp_rank, dp_rank + 1)
        first: int | None = None
        latencies: list[int] = []
        # Every rank calls new_group for every group, in this order.
        for pp in range(layout.pp_degree):
            for lead in self.leaders.replicas:
                block = self.leaders.block(lead)
                heads = [by_place[d, pp, 0].rank for d in block]
                leader = heads[0]
                first = leader if first is None else min(first, leader)
                group = self._new_group(heads)
                if rank in heads:
                    self._heads = group
                members = sorted(by_place[d, pp, t].rank for d in block for t in tp_ranks)
                if rank in members:
                    self.members, self.leader, self.replicas = members, leader, block
                    latencies = [by_place[d, pp, t].switch_ns for d in block for t in tp_ranks]
                for d in block:
                    group = self._new_group([by_place[d, pp, t].rank for t in tp_ranks])
                    if (d, pp) == (dp_rank, pp_rank):
                        self._tensor = group
        assert first is not None
        self.registrar = first
        self.fold = GroupFold(leader=self.leader, members=self.members, replicas=self.replicas)
        """How this rank's group folds its rounds."""
        measured = [ns for ns in latencies if ns >= 0]
        self.switch_latency_s: float | None = max(measured) / 1e9 if measured else None

    def _new_group(self, ranks: list[int]) -> Any:
        """A gloo group over `ranks` (None for one rank: nothing to say to itself)."""
        if len(ranks) < 2:
            return None
        return self._dist.new_group(sorted(ranks), timeout=self._timeout, backend="gloo")

    # ------------------------------------------------------------------ the table
    @staticmethod
    def _row(t: Any) -> _Row:
        values = [int(x) for x in t[: len(_FIELDS)].tolist()]
        name = t[len(_FIELDS) :].numpy().tobytes().rstrip(b"\0").decode(errors="replace")
        return _Row(*values, name=name)  # type: ignore[arg-type]

    def _check(self, rows: list[_Row]) -> None:
        problem = _differ(
            rows,
            lambda r: (r.dp_degree, r.pp_degree, r.tp_degree, r.per_stage, r.steps_per_round),
            _Row.layout,
        )
        if problem is not None:
            raise ConfigurationError(f"The job's ranks were given different layouts: {problem}")
        problem = _differ(
            rows, lambda r: r.pipeline_hash, lambda r: f"pipeline #{r.pipeline_hash:x}"
        )
        if problem is not None:
            raise ConfigurationError(
                "The job's ranks were given different pipelines (schedule, stages or "
                f"microbatches): {problem}"
            )
        places: dict[tuple[int, int, int], list[int]] = {}
        for row in rows:
            places.setdefault((row.dp_rank, row.pp_rank, row.tp_rank), []).append(row.rank)
        clashes = [(p, r) for p, r in places.items() if len(r) > 1]
        if clashes:
            text = "; ".join(
                f"rank(s) {_ranks_text(r)} all say (dp_rank, pp_rank, tp_rank) = {p}"
                for p, r in clashes[:_SHOWN]
            )
            raise ConfigurationError(f"The job's ranks overlap: {text}")
        problem = _differ(rows, lambda r: (r.name, r.clocks_hash, r.emulated), _Row.gpu)
        if problem is not None:
            raise ConfigurationError(
                "The job's GPUs differ: Perseus runs every copy of a pipeline stage at the same "
                f"clocks, so it needs one GPU type and one set of SM clocks everywhere: {problem}"
            )

    @property
    def is_leader(self) -> bool:
        """Whether this rank talks to the coordinator."""
        return self.leader == self.rank

    def share_job_id(self, register: Callable[[], str]) -> str:
        """The registrar registers the job; every rank returns what it answered (or raises
        its error), over the job's gloo group."""
        return share_job_id(
            self._dist, self.rank, register, src=self.registrar, group=self._control
        )

    # ------------------------------------------------------------------ a round
    def gather(self, result: ProfilingResult) -> ProfilingResult | None:
        """Fold this rank's round into its leader's (collective over the group: the
        `GroupFold` vectors gathered in two levels, a replica's tensor ranks to its head,
        the heads to the leader). The leader gets the group's `ProfilingResult`; the
        others None."""
        rows = self.fold.contribution(result, dp_rank=self.dp_rank)[None, :]
        rows = self._gather(rows, self._tensor, self.head)
        if rows is None or self.rank != self.head:
            return None
        rows = self._gather(rows, self._heads, self.leader)
        if rows is None:
            return None
        return self.fold.decode(rows, result)

    def _gather(self, rows: np.ndarray, group: Any, dst: int) -> np.ndarray | None:
        """`rows` of every rank of `group` stacked, at `dst` (None elsewhere)."""
        import torch

        if group is None:
            return rows
        mine = torch.from_numpy(np.ascontiguousarray(rows.reshape(-1)))
        size = self._dist.get_world_size(group)
        into = [torch.empty_like(mine) for _ in range(size)] if self.rank == dst else None
        try:
            self._dist.gather(mine, gather_list=into, dst=dst, group=group)
        except RuntimeError as exc:
            raise RankError(
                f"Rank {self.rank}: folding its round into its stage leader's (rank "
                f"{self.leader}, group {_ranks_text(self.members)}) failed: a rank of the "
                "group probably died "
                f"({type(exc).__name__}: {' '.join(str(exc).split())[:300]})"
            ) from exc
        if into is None:
            return None
        return torch.cat(into).numpy().reshape(-1, rows.shape[1])

    def hand_out(self, round_: int, schedule: FrequencySchedule | None, error: str = "") -> None:
        """Leader: give the group round `round_`'s schedule (or, with None, the error that
        kept the leader from getting one): to the replica heads, which pass it to their
        tensor ranks."""
        text = (
            schedule.model_copy(update={"status": None}).model_dump_json()
            if schedule is not None
            else error
        )
        self._broadcast(self._heads, self.leader, round_, schedule is not None, text)
        self._broadcast(self._tensor, self.head, round_, schedule is not None, text)

    def receive(self, round_: int) -> FrequencySchedule:
        """Follower: the schedule its leader hands out for round `round_` (the leader's,
        with every replica's list); raises the leader's error if it got none."""
        where = f"Rank {self.rank} (stage {self.pp_rank}, replica {self.dp_rank})"
        try:
            if self.rank == self.head:  # from the leader, then on to its tensor ranks
                ok, got_round, text = self._broadcast(self._heads, self.leader, round_, False, "")
                self._broadcast(self._tensor, self.head, got_round, ok, text)
            else:
                ok, got_round, text = self._broadcast(self._tensor, self.head, round_, False, "")
        except RuntimeError as exc:
            raise CoordinatorError(
                f"{where}: no schedule for round {round_} from its stage leader (rank "
                f"{self.leader}): {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            ) from exc
        if not ok:
            raise CoordinatorError(
                f"{where}: its stage leader (rank {self.leader}) got no schedule for round "
                f"{got_round}: {text}"
            )
        if got_round != round_:
            raise ScheduleError(
                f"{where}: its stage leader (rank {self.leader}) handed out round {got_round}'s "
                f"schedule, but this rank is about to run round {round_}"
            )
        try:
            return FrequencySchedule.model_validate_json(text)
        except ValueError as exc:
            raise CoordinatorError(
                f"{where}: its stage leader (rank {self.leader}) handed out an invalid "
                f"schedule: {exc}"
            ) from None

    def _broadcast(
        self, group: Any, src: int, round_: int, ok: bool, text: str
    ) -> tuple[bool, int, str]:
        """(ok, round, text) from `src` to every rank of `group` (as given, without one)."""
        import torch

        if group is None:
            return ok, round_, text
        dist = self._dist
        data = text.encode() if self.rank == src else b""
        header = torch.tensor([int(ok), len(data), round_], dtype=torch.int64)
        dist.broadcast(header, src=src, group=group)
        ok_flag, length, got_round = (int(x) for x in header.tolist())
        payload = torch.zeros(max(length, 1), dtype=torch.uint8)
        if self.rank == src and length:
            payload[:length] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        dist.broadcast(payload, src=src, group=group)
        return bool(ok_flag), got_round, payload[:length].numpy().tobytes().decode()
