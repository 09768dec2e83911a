"""From LP durations to discrete plans that meet their deadline, then greedy slack reclaim.

Only real profiled options are ever assigned. With ``P`` the blocking power, a plan's
energy is ``Σ (eᵢ − P·tᵢ) + P·S·T``, so for a fixed iteration time each instruction should
run the option with the lowest *effective cost* ``e − P·t`` it can afford. Per type, the
options that can ever be that choice form a *staircase*: sorted by time, each one strictly
cheaper (in effective cost) than every faster one. "Best option within a time budget" is
then the last staircase step at or below the budget.

Every method works on a batch of targets ``(LP durations dᵢ, deadline T)`` at once
(vectorised over the batch) and returns plans that fit in their ``T``:

- `follow_steps`: in topological order, each instruction takes the slowest hull vertex that
  still finishes no later than in the LP schedule, so rounding errors diffuse along paths
  instead of adding up. With ``capped=True`` no instruction goes past the slower end of its
  LP segment: an instruction the LP runs at a vertex keeps it and hands any time gained
  upstream on, until an instruction the LP runs *between* two far-apart vertices can afford
  the slower one. Lock-step fractional instructions then alternate between their two
  vertices (dithering) in the LP's proportions, instead of a neighbour with a cheap
  in-between option soaking up every gain. A per-instruction ``lead`` makes instructions
  pick as if their LP finish were that much earlier (see `follow_steps`). With
  ``vertices_first=True`` leftover slack then goes only to instructions it lifts onto a
  hull vertex before any in-between option is bought;
- `follow_steps_backward`: the mirror image, latest instructions first against the LP's
  latest-start schedule;
- `round_steps`: every instruction at the hull vertex at or below its LP duration, then
  slack reclaimed up to the LP segment's slower vertex, most valuable segments first.

Slack reclaim (`reclaim`), latest instructions first (reverse topological generations): an
instruction may finish as late as the earliest latest-start of its successors (each less
its edge's lag; or ``T``) and start as early as its predecessors allow (their current
times plus lags); it takes the best option within that window. Processing generations in reverse keeps every predecessor's
window valid, so the plan still fits in ``T``.
"""

from __future__ import annotations

import threading

import numpy as np

from perseus.solver.dag_arrays import earliest_of, latest_of
from perseus.solver.levels import Level, LevelRows
from perseus.solver.problem import SolverProblem

__all__ = ["Rounder"]

_REL_TOL = 1e-12
_TIERS = 2


class Rounder:
    """Vectorised rounding + slack reclaim for one `SolverProblem`."""

    def __init__(self, problem: SolverProblem):
        self.problem = problem
        P = problem.p2p_power_w
        steps_t, steps_idx = [], []
        for o in problem.type_options:
            eff = o.energy_j - P * o.time_s
            order = np.lexsort((eff, o.time_s))
            best = np.inf
            ts, idx = [], []
            for k in order:
                if eff[k] < best:
                    best = eff[k]
                    ts.append(o.time_s[k])
                    idx.append(k)
            steps_t.append(np.array(ts))
            steps_idx.append(np.array(idx, dtype=np.int64))
        width = max(len(s) for s in steps_t)
        ntypes = len(steps_t)
        self.step_time = np.full((ntypes, width), np.inf)
        self.step_option = np.zeros((ntypes, width), dtype=np.int64)
        self.step_count = np.array([len(s) for s in steps_t], dtype=np.int64)
        for k, (t, i) in enumerate(zip(steps_t, steps_idx, strict=True)):
            self.step_time[k, : len(t)] = t
            self.step_option[k, : len(i)] = i
        # Hull vertices (real options) as staircase positions, padded with +inf times.
        hmax = max(len(h.time_s) for h in problem.hulls)
        self.vertex_time = np.full((ntypes, hmax), np.inf)
        self.vertex_step = np.zeros((ntypes, hmax), dtype=np.int64)
        for k, h in enumerate(problem.hulls):
            st = self.step_time[k, : self.step_count[k]]
            self.vertex_time[k, : len(h.time_s)] = h.time_s
            pos = np.searchsorted(st, h.time_s * (1 + _REL_TOL), side="right") - 1
            self.vertex_step[k, : len(h.time_s)] = pos
            self.vertex_step[k, len(h.time_s) :] = pos[-1]
        self._type_rows = [np.flatnonzero(problem.type_of == k) for k in range(ntypes)]
        self._local = threading.local()  # per-thread scratch arrays (`_workspace`)
        self._levels = [
            Level(
                lv,
                pred,
                succ,
                pred_lag,
                succ_lag,
                LevelRows(self.step_time[problem.type_of[lv]], np.nan),
                LevelRows(self.vertex_time[problem.type_of[lv]], np.nan),
                LevelRows(self.vertex_step[problem.type_of[lv]], 0),
            )
            for lv, pred, succ, pred_lag, succ_lag in zip(
                problem.level_rows,
                problem.level_preds,
                problem.level_succs,
                problem.level_pred_lags,
                problem.level_succ_lags,
                strict=True,
            )
        ]

    def staircase(self, type_index: int) -> np.ndarray:
        """Option indices of one option type's staircase, fastest first: every option
        that can pay (no faster option has a lower effective cost ``e − P·t``)."""
        return self.step_option[type_index, : self.step_count[type_index]]

    def round(self, durations: np.ndarray, deadlines: np.ndarray) -> np.ndarray:
        """Option indices ``(n, K)`` for LP durations ``(n, K)`` and deadlines ``(K,)``."""
        return self.options(self.round_steps(durations, deadlines))

    def steps_of(self, choice: np.ndarray) -> np.ndarray | None:
        """Staircase positions of option indices `choice` ``(n,)``; ``None`` if an option
        is off the staircase (e.g. a max-frequency option slower than a cheaper one)."""
        pb = self.problem
        hit = self.step_option[pb.type_of] == choice[:, None]
        hit &= np.arange(hit.shape[1])[None, :] < self.step_count[pb.type_of][:, None]
        if not hit.any(axis=1).all():
            return None
        return hit.argmax(axis=1)

    def _workspace(self, plans: int) -> tuple[np.ndarray, np.ndarray]:
        """``(n, plans)`` and ``(n + 1, plans)`` scratch arrays, kept for the next call of
        the same width (a batch's passes reuse them instead of faulting in fresh pages).
        Every call from one thread hands out the same two arrays: a caller's contents last
        until its next `reclaim` or `follow_steps`; each thread has its own (the frontier
        rounds several ways at once)."""
        n = self.problem.n
        work: tuple[np.ndarray, np.ndarray] | None = getattr(self._local, "work", None)
        if work is None or work[0].shape != (n, plans):
            work = (np.empty((n, plans)), np.empty((n + 1, plans)))
            self._local.work = work
        return work

    def times(self, step: np.ndarray) -> np.ndarray:
        """Durations of staircase positions `step` ``(n, K)``."""
        return self.step_time[self.problem.type_of[:, None], step]

    def options(self, step: np.ndarray) -> np.ndarray:
        """Option indices of staircase positions `step` ``(n, K)``."""
        return self.step_option[self.problem.type_of[:, None], step]

    def segments(self, durations: np.ndarray) -> tuple[np.ndarray, ...]:
        """Where LP durations ``(n, K)`` lie on their hulls.

        Returns ``(hi, lo_step, cap_step, value)``: the index of the hull vertex at or above
        each duration (the slower end of its LP segment; the vertex itself when the LP runs
        one), the staircase positions of the vertices at or below and at or above it, and
        the hull slope (W) of the segment (0 at a vertex): what a second of slack is worth
        to that instruction in the LP.
        """
        pb = self.problem
        D = np.asarray(durations, dtype=float)
        hi = np.empty(D.shape, dtype=np.int64)
        lo_step = np.empty(D.shape, dtype=np.int64)
        cap_step = np.empty(D.shape, dtype=np.int64)
        value = np.zeros(D.shape)
        for k, rows in enumerate(self._type_rows):
            if len(rows):
                st = self.step_time[k, : self.step_count[k]]
                hull = pb.hulls[k]
                last = len(hull.time_s) - 1
                d = D[rows]
                lo = np.clip(
                    np.searchsorted(hull.time_s, d * (1 + _REL_TOL), side="right") - 1, 0, last
                )
                hi[rows] = np.minimum(
                    np.searchsorted(hull.time_s, d * (1 - _REL_TOL), side="left"), last
                )
                lo_step[rows] = (
                    np.searchsorted(st, hull.time_s[lo] * (1 + _REL_TOL), side="right") - 1
                )
                cap_step[rows] = (
                    np.searchsorted(st, hull.time_s[hi[rows]] * (1 + _REL_TOL), side="right") - 1
                )
                if last > 0:
                    slopes = np.concatenate([hull.slopes_w, [0.0]])
                    value[rows] = np.where(hi[rows] > lo, slopes[lo], 0.0)
        np.maximum(lo_step, 0, out=lo_step)
        np.maximum(cap_step, lo_step, out=cap_step)
        return hi, lo_step, cap_step, value

    def tiered_reclaim(
        self,
        step: np.ndarray,
        T: np.ndarray,
        cap: np.ndarray,
        value: np.ndarray,
        *,
        vertices_first: bool = False,
    ) -> None:
        """Reclaim slack up to `cap`, most valuable LP segments first (halving the slope
        threshold each pass), then without limit; in place on staircase positions.

        With `vertices_first`, the tiered passes only move instructions onto hull
        vertices: slack too small to reach the next vertex stays free for an earlier
        instruction that can reach one, instead of buying an in-between option that sits
        well above the hull. A capped pass over every staircase step follows.
        """
        top = value.max(axis=0) if value.size else np.zeros(value.shape[1:])  # per plan
        threshold = top / 2
        done = value <= 0
        for _ in range(_TIERS):
            allowed = (value >= threshold) & ~done
            if not allowed.any():
                break
            self.reclaim(
                step,
                T,
                np.where(allowed, np.maximum(cap, step), step),
                vertices_only=vertices_first,
            )
            done |= allowed
            threshold = threshold / 2
        if vertices_first:
            self.reclaim(step, T, np.maximum(cap, step), vertices_only=True)
            self.reclaim(step, T, np.maximum(cap, step))
        elif not done.all():
            self.reclaim(step, T, np.maximum(cap, step))
        self.reclaim(step, T, None)

    def follow_steps(
        self,
        durations: np.ndarray,
        deadlines: np.ndarray,
        *,
        capped: bool = False,
        vertices_first: bool = False,
        lead: np.ndarray | None = None,
    ) -> np.ndarray:
        """Round by following the LP schedule, then reclaim slack (staircase positions).

        In topological order, each instruction takes the slowest hull vertex that still
        finishes no later than it does in the LP schedule (earliest starts with the LP
        durations). Instructions whose predecessors finished early may run slower than
        their LP duration: rounding errors diffuse along every path instead of adding up,
        and every path stays within the LP's iteration time.

        With `capped`, no instruction runs slower than the slower end of its LP segment: an
        instruction the LP runs at a hull vertex keeps it and passes time gained upstream
        on to later instructions, so fractional ones alternate between their segment's two
        vertices (dithering) instead of a cheap neighbour soaking up every gain. Leftover
        slack then goes to the most valuable LP segments first (`tiered_reclaim`), with
        `vertices_first` onto hull vertices only before any in-between option.

        `lead` ``(n,)`` (seconds) staggers the dithering: instruction ``i`` picks its vertex
        as if its LP finish time were ``lead[i]`` earlier, so instructions with a larger
        lead keep a margin and hand the slower steps to those with a smaller one.
        """
        pb = self.problem
        D = np.asarray(durations, dtype=float)
        T = np.asarray(deadlines, dtype=float)
        segs = self.segments(D) if capped else None
        # In the scratch arrays that `reclaim` refills: read only before the reclaim below.
        lp_finish = pb.start_finish(D, out=self._workspace(D.shape[1]))[1]
        finish = np.zeros((pb.n + 1, D.shape[1]))
        step = np.empty(D.shape, dtype=np.int64)
        for level in self._levels:
            lv = level.index
            start = latest_of(finish, level.preds, level.pred_lags)
            budget = (lp_finish[lv] - start) * (1 + _REL_TOL)
            if lead is not None:
                budget = budget - lead[lv][:, None]
            k = np.maximum(level.vertex_time.count_at_most(budget) - 1, 0)
            if segs is not None:
                k = np.minimum(k, segs[0][lv])  # at most the LP segment's slower vertex
            step[lv] = level.vertex_step.take(k)
            finish[lv] = start + level.step_time.take(step[lv])
        T_plan = np.maximum(T, finish.max(axis=0))
        if segs is not None:
            _, _, cap, value = segs
            self.tiered_reclaim(step, T_plan, cap, value, vertices_first=vertices_first)
        else:
            self.reclaim(step, T_plan, None)
        return step

    def follow_steps_backward(self, durations: np.ndarray, deadlines: np.ndarray) -> np.ndarray:
        """The mirror image of `follow_steps`: latest instructions first, each takes the
        slowest hull vertex that still starts no earlier than in the LP schedule at latest
        starts (every path ends by the deadline), then slack is reclaimed."""
        pb = self.problem
        D = np.asarray(durations, dtype=float)
        T = np.asarray(deadlines, dtype=float)
        lp_start = pb.latest_starts(D, T)
        start = np.empty((pb.n + 1, D.shape[1]))
        start[pb.n] = T
        step = np.empty(D.shape, dtype=np.int64)
        for level in reversed(self._levels):
            lv = level.index
            finish = earliest_of(start, level.succs, level.succ_lags)
            budget = (finish - lp_start[lv]) * (1 + _REL_TOL)
            k = np.maximum(level.vertex_time.count_at_most(budget) - 1, 0)
            step[lv] = level.vertex_step.take(k)
            start[lv] = finish - level.step_time.take(step[lv])
        T_plan = pb.makespan(self.times(step))
        self.reclaim(step, np.maximum(T, T_plan), None)
        return step

    def round_steps(self, durations: np.ndarray, deadlines: np.ndarray) -> np.ndarray:
        """Staircase positions ``(n, K)`` for LP durations ``(n, K)`` and deadlines ``(K,)``."""
        D = np.asarray(durations, dtype=float)
        T = np.asarray(deadlines, dtype=float)
        # The hull vertex at or below each LP duration; the cap is the vertex above.
        _, step, cap, value = self.segments(D)
        self.tiered_reclaim(step, T, cap, value)
        return step

    def reclaim(
        self,
        step: np.ndarray,
        T: np.ndarray,
        cap: np.ndarray | None = None,
        *,
        vertices_only: bool = False,
    ) -> None:
        """One latest-first slack-reclaim pass, in place on staircase positions `step`
        (with `vertices_only`, an instruction moves only onto a hull vertex)."""
        pb = self.problem
        times = self.step_time[pb.type_of[:, None], step]
        start, latest_start = self._workspace(step.shape[1])
        pb.start_finish(times, out=(start, latest_start))
        # The earliest finishes are not needed: latest starts overwrite them, successors
        # (written earlier in this pass) and row n (the deadline) first.
        latest_start[pb.n] = T
        for level in reversed(self._levels):
            lv = level.index
            latest_finish = earliest_of(latest_start, level.succs, level.succ_lags)
            budget = latest_finish - start[lv]
            budget *= 1 + _REL_TOL
            if vertices_only:
                fits = level.vertex_time.count_at_most(budget) - 1
                fits = np.where(fits >= 0, level.vertex_step.take(np.maximum(fits, 0)), -1)
            else:
                fits = level.step_time.count_at_most(budget)
                fits -= 1
            if cap is not None:
                np.minimum(fits, cap[lv], out=fits)
            np.maximum(fits, step[lv], out=fits)
            step[lv] = fits
            latest_finish -= level.step_time.take(fits)
            latest_start[lv] = latest_finish

    def neighbours(self, step: np.ndarray, max_columns: int) -> np.ndarray | None:
        """All plans that differ from plan `step` ``(n,)`` in one or two instructions.

        Returns staircase positions ``(n, V)`` or ``None`` when there are more than
        `max_columns` of them (the local search is for small problems).
        """
        pb = self.problem
        counts = self.step_count[pb.type_of]
        n_singles = int(counts.sum()) - pb.n  # every other step of every instruction
        if n_singles + n_singles * (n_singles - 1) // 2 > max_columns:
            return None  # decided before listing them: big problems have hundreds of thousands
        singles = [(i, s) for i in range(pb.n) for s in range(int(counts[i])) if s != step[i]]
        cols = []
        for a, (i, s) in enumerate(singles):
            base = step.copy()
            base[i] = s
            cols.append(base)
            for j, t in singles[a + 1 :]:
                if j != i:
                    other = base.copy()
                    other[j] = t
                    cols.append(other)
        return np.stack(cols, axis=1) if cols else None

    def anchor(self, choice: np.ndarray, deadline: float) -> np.ndarray:
        """Spend a plan's slack without touching its critical instructions.

        `choice` ``(n,)`` are option indices. Instructions with no slack keep their
        option, so the longest path is computed with the same additions and the
        iteration time stays the same to the last bit. Latest first, every other
        instruction takes the profiled option (any, faster or slower) of lowest effective
        cost that fits in its window.
        """
        pb = self.problem
        P = pb.p2p_power_w
        choice = choice.copy()
        t_cur = pb.opt_time[pb.type_of, choice]
        start, _ = pb.start_finish(t_cur)
        latest = pb.latest_starts(t_cur, deadline)
        fixed = np.abs(latest - start) <= 1e-12 * max(deadline, 1.0)
        latest_start = np.empty(pb.n + 1)
        latest_start[pb.n] = deadline
        for lv, succ, lag in zip(
            reversed(pb.levels), reversed(pb.level_succs), reversed(pb.level_succ_lags), strict=True
        ):
            latest_finish = earliest_of(latest_start, succ, lag)
            budget = latest_finish - start[lv]
            ot = pb.opt_time[pb.type_of[lv]]
            with np.errstate(invalid="ignore"):  # padding options: inf − P·inf, never chosen
                eff = pb.opt_energy[pb.type_of[lv]] - P * ot
            ok = ot <= budget[:, None]
            rows = np.arange(len(lv))
            ok[rows, choice[lv]] = True
            best = np.where(ok, eff, np.inf).argmin(axis=1)
            best = np.where(fixed[lv], choice[lv], best)
            choice[lv] = best
            latest_start[lv] = latest_finish - ot[rows, best]
        return choice
