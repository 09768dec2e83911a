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

A rank's place (from its arguments or a ``DeviceMesh``) is `perseus.client.place`'s.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from perseus.client.bootstrap import share_job_id
from perseus.client.wire.fold import GroupFold
from perseus.client.wire.job_table import check_table, decode_row, encode_row, ranks_text
from perseus.errors import CoordinatorError, RankError, ScheduleError
from perseus.protocol import (
    FrequencySchedule,
    Leaders,
    ParallelLayout,
    ProfilingResult,
)

__all__ = ["GroupFold", "JobFanOut"]


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
        mine = encode_row(
            rank=rank,
            dp_rank=dp_rank,
            pp_rank=pp_rank,
            tp_rank=tp_rank,
            layout=layout,
            per_stage=per_stage,
            steps_per_round=steps_per_round,
            pipeline_key=pipeline_key,
            gpu_name=gpu_name,
            frequencies=frequencies,
            emulated=emulated,
            switch_latency_s=switch_latency_s,
        )
        gathered = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(gathered, mine, group=self._control)
        rows = [decode_row(t) for t in gathered]
        check_table(rows)
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
        latencies: list[int] = []
        # Every rank calls new_group for every group, in this order.
        for pp in range(layout.pp_degree):
            for lead in self.leaders.replicas:
                block = self.leaders.block(lead)
                heads = [by_place[d, pp, 0].rank for d in block]
                leader = heads[0]
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
        self.registrar = min(
            by_place[lead, pp, 0].rank
            for pp in range(layout.pp_degree)
            for lead in self.leaders.replicas
        )
        self.fold = GroupFold(leader=self.leader, members=self.members, replicas=self.replicas)
        """How this rank's group folds its rounds."""
        measured = [ns for ns in latencies if ns >= 0]
        self.switch_latency_s: float | None = max(measured) / 1e9 if measured else None

    def _new_group(self, ranks: list[int]) -> Any:
        """A gloo group over `ranks` (None for one rank: nothing to say to itself)."""
        if len(ranks) < 2:
            return None
        return self._dist.new_group(sorted(ranks), timeout=self._timeout, backend="gloo")

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
                f"{self.leader}, group {ranks_text(self.members)}) failed: a rank of the "
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
