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
2. **A group per leader.** For every stage and block, in the same order on every rank,
   ``torch.distributed.new_group`` over the ranks its leader speaks for (the block's
   replicas × every tensor rank); always gloo on CPU tensors, whatever backend trains, so
   this traffic stays off the training's NCCL streams. A leader that speaks for itself
   alone (dp = tp = 1) gets no group and no collective.

Each round, on the hook's exchange thread (off the training thread):

- `JobFanOut.gather`: every rank of a group folds its round into its leader's with two
  ``reduce`` calls (a MAX and a SUM of float64 vectors laid out the same on every rank):
  per iteration the slowest GPU's time and the group's energy; per instruction the slowest
  GPU's time and the energy of the tensor ranks of the leader's own replica; per replica its
  slowest tensor rank's iteration time, its busiest tensor rank's instruction time, its
  energy; and each idle GPU's blocking power. The leader gets one `ProfilingResult` that
  speaks for the group (`ProfilingResult.replicas`, `ProfilingResult.idle_power_w`).
- `JobFanOut.hand_out` / `JobFanOut.receive`: the leader broadcasts the schedule the
  coordinator gave it (JSON, the round number in a header; the error instead when it got
  none), and every rank of its group checks that it is for the round it is about to run
  and runs its replica's list (`FrequencySchedule.frequencies_for`). No rank ever runs a
  schedule its leader did not hand out for that round.

`mesh_place` reads a rank's place from a ``torch.distributed.DeviceMesh``.
"""

from __future__ import annotations

import datetime
import hashlib
import math
import statistics
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

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

__all__ = ["JobFanOut", "MeshPlace", "mesh_place"]

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
        members: The global ranks of this rank's group, ascending.
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
        self.leaders = Leaders(layout, per_stage)
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
        by_place = {(r.dp_rank, r.pp_rank, r.tp_rank): r for r in rows}
        self._group: Any = None
        self.members: list[int] = [rank]
        self.leader = rank
        self.replicas = range(dp_rank, dp_rank + 1)
        first: int | None = None
        latencies: list[int] = []
        for pp in range(layout.pp_degree):
            for lead in self.leaders.replicas:
                block = self.leaders.block(lead)
                members = sorted(
                    by_place[d, pp, t].rank for d in block for t in range(layout.tp_degree)
                )
                leader = by_place[lead, pp, 0].rank
                first = leader if first is None else min(first, leader)
                group = None
                if len(members) > 1:  # every rank calls new_group for every group, in order
                    group = dist.new_group(members, timeout=self._timeout, backend="gloo")
                if rank in members:
                    self._group, self.members, self.leader, self.replicas = (
                        group,
                        members,
                        leader,
                        block,
                    )
                    latencies = [
                        by_place[d, pp, t].switch_ns for d in block for t in range(layout.tp_degree)
                    ]
        assert first is not None
        self.registrar = first
        measured = [ns for ns in latencies if ns >= 0]
        self.switch_latency_s: float | None = max(measured) / 1e9 if measured else None

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
        """Fold this rank's round into its leader's (collective over the group). The
        leader gets the group's `ProfilingResult`; the others None."""
        import torch

        kinds = [k for k in INSTRUCTIONS if k in result.time_breakdown]
        times = [x for k in kinds for it in result.time_breakdown[k] for x in it]
        energies = [x for k in kinds for it in result.energy_breakdown.get(k, []) for x in it]
        shape = [(k, [len(it) for it in result.time_breakdown[k]]) for k in kinds]
        iters = len(result.iter_time)
        check = float(zlib.crc32(repr((shape, iters, len(energies))).encode()))
        n, r, g = len(times), len(self.replicas), len(self.members)
        busy_s = math.fsum(times) / iters
        compute_j = math.fsum(energies) / iters
        time_s = math.fsum(result.iter_time) / iters
        energy_j = math.fsum(result.iter_energy) / iters
        idle_s = time_s - busy_s
        idle_w = (
            max(0.0, (energy_j - compute_j) / idle_s)
            if idle_s > 1e-6 * max(time_s, 1e-12)
            else None
        )
        slot = self.dp_rank - self.replicas.start
        top = torch.zeros(2 + n + iters + 2 * r, dtype=torch.float64)
        top[0], top[1] = check, -check
        top[2 : 2 + n] = torch.tensor(times, dtype=torch.float64)
        top[2 + n : 2 + n + iters] = torch.tensor(result.iter_time, dtype=torch.float64)
        top[2 + n + iters + 2 * slot] = time_s
        top[2 + n + iters + 2 * slot + 1] = busy_s
        total = torch.zeros(1 + n + iters + r + g, dtype=torch.float64)
        total[0] = 1.0
        if self.dp_rank == self.replicas.start and len(energies) == n:
            total[1 : 1 + n] = torch.tensor(energies, dtype=torch.float64)
        total[1 + n : 1 + n + iters] = torch.tensor(result.iter_energy, dtype=torch.float64)
        total[1 + n + iters + slot] = energy_j
        if idle_w is not None:  # 0 means "never idle"; a power is stored plus one
            total[1 + n + iters + r + self.members.index(self.rank)] = idle_w + 1.0
        if self._group is not None:
            try:
                self._dist.reduce(
                    top, dst=self.leader, op=self._dist.ReduceOp.MAX, group=self._group
                )
                self._dist.reduce(
                    total, dst=self.leader, op=self._dist.ReduceOp.SUM, group=self._group
                )
            except RuntimeError as exc:
                raise RankError(
                    f"Rank {self.rank}: folding its round into its stage leader's (rank "
                    f"{self.leader}, group {_ranks_text(self.members)}) failed: a rank of the "
                    f"group probably died ({type(exc).__name__}: {' '.join(str(exc).split())[:300]})"
                ) from exc
        if not self.is_leader:
            return None
        if top[0].item() != -top[1].item() or round(total[0].item()) != g:
            raise RankError(
                f"Rank {self.rank} (leader of stage {self.pp_rank}, replicas "
                f"{_ranks_text(list(self.replicas))}): the ranks of its group "
                f"{_ranks_text(self.members)} measured rounds of different shapes; every rank "
                "of a stage must run the same instructions and steps per round"
            )
        base = 2 + n + iters
        idle = [v - 1.0 for v in total[1 + n + iters + r :].tolist() if v > 0.5]
        folded_t = top[2 : 2 + n].tolist()
        folded_e = total[1 : 1 + n].tolist()
        time_breakdown: dict[str, list[list[float]]] = {}
        energy_breakdown: dict[str, list[list[float]]] = {}
        i = 0
        for kind, lengths in shape:
            time_breakdown[kind], energy_breakdown[kind] = [], []
            for length in lengths:
                time_breakdown[kind].append(folded_t[i : i + length])
                energy_breakdown[kind].append(folded_e[i : i + length])
                i += length
        return ProfilingResult(
            rank=self.rank,
            iter_time=top[2 + n : base].tolist(),
            iter_energy=total[1 + n : 1 + n + iters].tolist(),
            time_breakdown=time_breakdown,  # type: ignore[arg-type]
            energy_breakdown=energy_breakdown if energies else {},  # type: ignore[arg-type]
            replicas=[
                ReplicaFigures(
                    dp_rank=dp,
                    iter_time_s=top[base + 2 * j].item(),
                    busy_s=top[base + 2 * j + 1].item(),
                    energy_j=total[1 + n + iters + j].item(),
                )
                for j, dp in enumerate(self.replicas)
            ],
            idle_power_w=statistics.median(idle) if idle else None,
        )

    def hand_out(self, round_: int, schedule: FrequencySchedule | None, error: str = "") -> None:
        """Leader: give the group round `round_`'s schedule (or, with None, the error that
        kept the leader from getting one)."""
        if self._group is None:
            return
        text = (
            ""
            if schedule is None
            else schedule.model_copy(update={"status": None}).model_dump_json()
        )
        self._broadcast(round_, schedule is not None, text if schedule is not None else error)

    def receive(self, round_: int) -> FrequencySchedule:
        """Follower: the schedule its leader hands out for round `round_` (the leader's,
        with every replica's list); raises the leader's error if it got none."""
        where = f"Rank {self.rank} (stage {self.pp_rank}, replica {self.dp_rank})"
        try:
            ok, got_round, text = self._broadcast(round_, False, "")
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

    def _broadcast(self, round_: int, ok: bool, text: str) -> tuple[bool, int, str]:
        import torch

        dist = self._dist
        data = text.encode() if self.is_leader else b""
        header = torch.tensor([int(ok), len(data), round_], dtype=torch.int64)
        dist.broadcast(header, src=self.leader, group=self._group)
        ok_flag, length, got_round = (int(x) for x in header.tolist())
        payload = torch.zeros(max(length, 1), dtype=torch.uint8)
        if self.is_leader and length:
            payload[:length] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        dist.broadcast(payload, src=self.leader, group=self._group)
        return bool(ok_flag), got_round, payload[:length].numpy().tobytes().decode()
