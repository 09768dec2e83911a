"""The solver's array view of one (profile, schedule): instructions, DAG, options, hulls.

Everything the LP, the rounding and the exact scoring need is turned into numpy arrays
once, so that the inner loops never touch `Instruction` objects:

- instructions are numbered ``0..n-1`` in a topological order of the DAG;
- the DAG is kept as padded predecessor/successor tables plus its topological
  *generations* (``levels``): nodes of one generation have no edges among them, so a
  longest-path pass is one vectorised step per generation, for many plans at once;
- instructions that share their profiled options (same stage, kind and chunk) share an
  option *type*; the options of every type are held in padded tables.

`finish_times` and `score` reproduce `perseus.plan.evaluate` bit for bit (same additions
in the same order), for a batch of plans at once; the tests check this.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perseus.domain.profile import InstructionOptions, InstructionProfile
from perseus.domain.schedule import Instruction, PipelineSchedule
from perseus.errors import ScheduleError, SolverError

__all__ = ["CostHull", "SolverProblem", "effective_cost_hull"]


@dataclass(frozen=True)
class CostHull:
    """Convex, non-increasing piecewise-linear effective cost of one instruction type.

    Vertices ``(time_s[k], cost_j[k])`` with ``time_s`` increasing and ``cost_j``
    decreasing; the cost is ``e − P_block·t`` and is constant to the right of the last
    vertex (running slower than that never pays under the LP).
    """

    time_s: np.ndarray
    cost_j: np.ndarray

    @property
    def slopes_w(self) -> np.ndarray:
        """Marginal cost of shortening, per segment, left to right (positive, decreasing)."""
        return -np.diff(self.cost_j) / np.diff(self.time_s)

    def __call__(self, duration_s: np.ndarray) -> np.ndarray:
        """Cost at `duration_s` (clamped into ``[time_s[0], ∞)``)."""
        return np.interp(duration_s, self.time_s, self.cost_j)


def effective_cost_hull(time_s: np.ndarray, energy_j: np.ndarray, p2p_power_w: float) -> CostHull:
    """Lower convex hull of the points ``(t, e − P·t)``, from the fastest point to its minimum.

    Any option (dominated or not) lies on or above the returned function extended as a
    constant to the right, so the LP built on it is a true lower bound.
    """
    t = np.asarray(time_s, dtype=float)
    c = np.asarray(energy_j, dtype=float) - p2p_power_w * t
    order = np.lexsort((c, t))
    pts: list[tuple[float, float]] = []
    for x, y in zip(t[order], c[order], strict=True):
        if pts and x == pts[-1][0]:
            continue  # same time, higher cost (sorted by cost within a time)
        while len(pts) >= 2:
            (x1, y1), (x2, y2) = pts[-2], pts[-1]
            # Drop the middle point when it is on or above the segment (x1,y1)-(x,y).
            if (y2 - y1) * (x - x1) >= (y - y1) * (x2 - x1):
                pts.pop()
            else:
                break
        pts.append((float(x), float(y)))
    costs = [p[1] for p in pts]
    last = int(np.argmin(costs))
    hull = np.array(pts[: last + 1])
    return CostHull(time_s=hull[:, 0].copy(), cost_j=hull[:, 1].copy())


class SolverProblem:
    """Arrays for one profile + schedule + blocking power. Build with `SolverProblem.build`."""

    def __init__(
        self,
        *,
        profile: InstructionProfile,
        schedule: PipelineSchedule,
        p2p_power_w: float,
        instructions: list[Instruction],
        type_keys: list[tuple[int, str, int]],
        type_options: list[InstructionOptions],
        type_of: np.ndarray,
        preds: np.ndarray,
        succs: np.ndarray,
        edges: np.ndarray,
        levels: list[np.ndarray],
        level_of: np.ndarray,
        stage_index: list[np.ndarray],
    ):
        self.profile = profile
        self.schedule = schedule
        self.p2p_power_w = float(p2p_power_w)
        self.instructions = instructions
        self.n = len(instructions)
        self.type_keys = type_keys
        self.type_options = type_options
        self.type_of = type_of
        self.preds = preds
        self.succs = succs
        self.edges = edges
        self.levels = levels
        # The same levels as slices where their instructions are numbered consecutively
        # (always, with the schedules' generation-by-generation topological order): the
        # hot loops then read and write views instead of fancy-index copies.
        self.level_rows: list[np.ndarray | slice] = [_rows(lv) for lv in levels]
        self.level_of = level_of
        # Per level, one index array per adjacency column: the max/min over a level's
        # predecessors/successors as a few elementwise ops instead of an axis reduction.
        self.level_preds = [[preds[lv, c] for c in range(preds.shape[1])] for lv in levels]
        self.level_succs = [[succs[lv, c] for c in range(succs.shape[1])] for lv in levels]
        self.stage_index = stage_index
        width = max(len(o) for o in type_options)
        ntypes = len(type_options)
        self.opt_time = np.full((ntypes, width), np.inf)
        self.opt_energy = np.full((ntypes, width), np.inf)
        self.opt_freq = np.zeros((ntypes, width), dtype=np.int64)
        self.opt_count = np.array([len(o) for o in type_options], dtype=np.int64)
        for k, o in enumerate(type_options):
            self.opt_time[k, : len(o)] = o.time_s
            self.opt_energy[k, : len(o)] = o.energy_j
            self.opt_freq[k, : len(o)] = o.freq_mhz
        self.hulls = [
            effective_cost_hull(o.time_s, o.energy_j, self.p2p_power_w) for o in type_options
        ]

    # ------------------------------------------------------------------ building
    @classmethod
    def build(
        cls, profile: InstructionProfile, schedule: PipelineSchedule, *, p2p_power_w: float
    ) -> SolverProblem:
        """Validate the inputs and lay out the arrays."""
        if not np.isfinite(p2p_power_w) or p2p_power_w < 0:
            raise SolverError(
                f"The blocking (P2P) power must be a finite number of watts >= 0, got {p2p_power_w!r}"
            )
        try:
            schedule.check_profile(profile)
        except ScheduleError as exc:
            raise SolverError(str(exc)) from exc
        dag = schedule.dag()
        instructions = schedule.instructions()
        if not instructions:
            raise SolverError("The schedule has no instructions to plan")
        index = {instr: k for k, instr in enumerate(instructions)}
        n = len(instructions)

        type_index: dict[tuple[int, str, int], int] = {}
        type_keys: list[tuple[int, str, int]] = []
        type_options: list[InstructionOptions] = []
        type_of = np.empty(n, dtype=np.int64)
        for k, instr in enumerate(instructions):
            key = (instr.stage, instr.kind, instr.chunk)
            if key not in type_index:
                type_index[key] = len(type_keys)
                type_keys.append(key)
                type_options.append(schedule.options(profile, instr))
            type_of[k] = type_index[key]

        edges = np.array([(index[u], index[v]) for u, v in dag.edges()], dtype=np.int64).reshape(
            -1, 2
        )
        preds = _padded_adjacency(n, edges[:, 1], edges[:, 0])
        succs = _padded_adjacency(n, edges[:, 0], edges[:, 1])

        level = np.zeros(n, dtype=np.int64)
        for k in range(n):  # topological order: predecessors already have their level
            p = preds[k]
            p = p[p < n]
            if len(p):
                level[k] = level[p].max() + 1
        order = np.argsort(level, kind="stable")
        bounds = np.searchsorted(level[order], np.arange(level.max() + 2))
        levels = [order[bounds[i] : bounds[i + 1]] for i in range(len(bounds) - 1)]
        stage_index = [np.array([index[i] for i in o], dtype=np.int64) for o in schedule.orders]
        return cls(
            profile=profile,
            schedule=schedule,
            p2p_power_w=p2p_power_w,
            instructions=instructions,
            type_keys=type_keys,
            type_options=type_options,
            type_of=type_of,
            preds=preds,
            succs=succs,
            edges=edges,
            levels=levels,
            level_of=level,
            stage_index=stage_index,
        )

    # ------------------------------------------------------------------ accounting
    def start_finish(self, durations: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Earliest (start, finish) times for durations of shape ``(n,)`` or ``(n, K)``."""
        d = np.asarray(durations, dtype=float)
        start = np.zeros(d.shape)
        finish = np.zeros((self.n + 1, *d.shape[1:]))  # row n: the "no predecessor" zero
        for lv, pred in zip(self.level_rows, self.level_preds, strict=True):
            start[lv] = latest_of(finish, pred)
            finish[lv] = start[lv] + d[lv]
        return start, finish[: self.n]

    def finish_times(self, durations: np.ndarray) -> np.ndarray:
        """Earliest finish times for durations of shape ``(n,)`` or ``(n, K)``."""
        return self.start_finish(durations)[1]

    def makespan(self, durations: np.ndarray) -> np.ndarray | float:
        """Longest path (iteration time) for one or many duration vectors."""
        return self.finish_times(durations).max(axis=0)

    def latest_starts(self, durations: np.ndarray, deadline_s: np.ndarray | float) -> np.ndarray:
        """Latest start times that keep every path within `deadline_s` (per column)."""
        d = np.asarray(durations, dtype=float)
        ls = np.empty((self.n + 1, *d.shape[1:]))
        ls[self.n] = deadline_s
        for lv, succ in zip(reversed(self.level_rows), reversed(self.level_succs), strict=True):
            ls[lv] = earliest_of(ls, succ) - d[lv]
        return ls[: self.n]

    def choices_to_arrays(self, choice: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(time_s, energy_j) of option indices `choice` (shape ``(n,)`` or ``(n, K)``)."""
        t_idx = self.type_of if choice.ndim == 1 else self.type_of[:, None]
        return self.opt_time[t_idx, choice], self.opt_energy[t_idx, choice]

    def score(
        self, choice: np.ndarray, *, exact: bool = True
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(iteration_time_s, energy_j, compute_energy_j) of plans ``(n, K)``.

        `choice` holds option indices. The arithmetic of `perseus.plan.evaluate`: earliest
        starts, ``T`` = latest finish, compute time as ``Σ (finish − start)``. With
        `exact`, the sums run one instruction at a time in topological order, as
        `evaluate`'s do, so the numbers are identical to its; otherwise numpy may sum
        pairwise (faster; equal to ~1e-15 relative), which is enough to rank candidates.
        """
        time_s, energy_j = self.choices_to_arrays(choice)
        start, finish = self.start_finish(time_s)
        T = finish.max(axis=0)
        busy = finish - start
        if exact:
            compute_e = np.cumsum(energy_j, axis=0)[-1]
            compute_t = np.cumsum(busy, axis=0)[-1]
        else:
            compute_e = energy_j.sum(axis=0)
            compute_t = busy.sum(axis=0)
        S = self.schedule.num_stages
        blocking = self.p2p_power_w * (S * T - compute_t)
        return T, compute_e + blocking, compute_e

    def choices_to_frequencies(self, choice: np.ndarray) -> np.ndarray:
        """Frequencies (MHz) of option indices `choice` (shape ``(n,)`` or ``(n, K)``)."""
        t_idx = self.type_of if choice.ndim == 1 else self.type_of[:, None]
        return self.opt_freq[t_idx, choice]

    def frequencies(self, choice: np.ndarray) -> list[list[int]]:
        """One plan's option indices ``(n,)`` as per-stage frequency lists (execution order)."""
        freq = self.choices_to_frequencies(choice)
        return [[int(f) for f in freq[idx]] for idx in self.stage_index]

    def choice_from_frequencies(self, frequencies: list[list[int]]) -> np.ndarray:
        """Option indices ``(n,)`` of a plan given as per-stage frequency lists.

        The inverse of `frequencies`; a frequency the profile has no option for is an error.
        """
        if len(frequencies) != len(self.stage_index):
            raise SolverError(
                f"The plan has {len(frequencies)} stages, the schedule {len(self.stage_index)}"
            )
        lookup = [{int(f): k for k, f in enumerate(o.freq_mhz)} for o in self.type_options]
        choice = np.empty(self.n, dtype=np.int64)
        for stage, (index, freqs) in enumerate(zip(self.stage_index, frequencies, strict=True)):
            if len(freqs) != len(index):
                raise SolverError(
                    f"Stage {stage} of the plan has {len(freqs)} instructions, the schedule {len(index)}"
                )
            for i, f in zip(index, freqs, strict=True):
                k = lookup[self.type_of[i]].get(int(f))
                if k is None:
                    ins = self.instructions[i]
                    raise SolverError(
                        f"Stage {stage}: the profile has no {ins.kind} option at {f} MHz"
                    )
                choice[i] = k
        return choice

    def max_frequency_choice(self) -> np.ndarray:
        """Option index of every instruction's highest profiled frequency."""
        best = np.array([int(np.argmax(o.freq_mhz)) for o in self.type_options], dtype=np.int64)
        return best[self.type_of]


def _rows(index: np.ndarray) -> np.ndarray | slice:
    """`index` as a slice when it is a run of consecutive integers, else unchanged."""
    if len(index) and np.all(np.diff(index) == 1):
        return slice(int(index[0]), int(index[-1]) + 1)
    return index


def latest_of(times: np.ndarray, columns: list[np.ndarray]) -> np.ndarray:
    """Row-wise max of ``times[c]`` over the adjacency columns (a new array)."""
    out = times[columns[0]]
    for c in columns[1:]:
        np.maximum(out, times[c], out=out)
    return out


def earliest_of(times: np.ndarray, columns: list[np.ndarray]) -> np.ndarray:
    """Row-wise min of ``times[c]`` over the adjacency columns (a new array)."""
    out = times[columns[0]]
    for c in columns[1:]:
        np.minimum(out, times[c], out=out)
    return out


def _padded_adjacency(n: int, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Row k lists the `cols` paired with `rows == k`, padded with the sentinel `n`."""
    counts = np.bincount(rows, minlength=n) if len(rows) else np.zeros(n, dtype=np.int64)
    width = max(1, int(counts.max()) if n else 1)
    table = np.full((n, width), n, dtype=np.int64)
    order = np.argsort(rows, kind="stable")
    r, c = rows[order], cols[order]
    starts = np.searchsorted(r, np.arange(n))
    pos = np.arange(len(r)) - starts[r]
    table[r, pos] = c
    return table
