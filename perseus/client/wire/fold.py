"""How a leader folds its group's rounds into one `ProfilingResult` (`GroupFold`).

Every rank of a group lays its round out as one float64 vector, the same on every rank
(`GroupFold.contribution`); the leader decodes the gathered rows (`GroupFold.decode`): per
iteration the slowest GPU's time and the group's energy; per instruction the slowest GPU's
time and the energy of the tensor ranks of its own replica; per replica its slowest tensor
rank's iteration time, its busiest tensor rank's instruction time, its energy; and the
median blocking power of the idle GPUs (`perseus.client.wire.leaders` moves the rows).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence

import numpy as np

from perseus.client.wire.job_table import ranks_text
from perseus.errors import RankError
from perseus.protocol import INSTRUCTIONS, ProfilingResult, ReplicaFigures

__all__ = ["GroupFold"]


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
                f"{ranks_text(list(self.replicas))}): the ranks of its group "
                f"{ranks_text(self.members)} measured rounds of different shapes; every rank "
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
            energy_windows=own.energy_windows,  # its own GPU's (perseus.schedulers.parallel)
            idle_before_s=own.idle_before_s,  # likewise
        )

    def fold(
        self, results: Mapping[int, ProfilingResult], dp_ranks: Mapping[int, int]
    ) -> ProfilingResult:
        """The leader's result from every member's (global rank → result, → dp rank), as
        the gather delivers them: for simulations and tests of whole jobs."""
        rows = np.stack([self.contribution(results[m], dp_rank=dp_ranks[m]) for m in self.members])
        return self.decode(rows, results[self.leader])
