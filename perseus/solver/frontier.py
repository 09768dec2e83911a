"""The time–energy frontier: exact LP sweep → discrete plans → exact scores → Pareto set.

`compute_frontier` runs, for one `SolverProblem` (DAG, option tables, blocking power ``P``):

1. the parametric LP (`perseus.solver.lp`) from the slowest useful iteration time down to
   the minimum time ``T_min`` (every node at its fastest option), breakpoint to breakpoint;
2. every LP breakpoint, and LP solutions inside LP segments wider than ``resolution_s``
   (there the optimal durations move linearly between the two breakpoints' durations), is
   rounded to discrete plans in four ways (`perseus.solver.rounding`), each following
   the LP schedule: forwards with *dithering* (no instruction finishes later than in the
   LP and none runs slower than the slower end of its LP segment, so time gained upstream
   flows on until a fractional instruction can afford its slower vertex), the same with
   a *staggered lead* (an instruction takes its slower vertex only while it runs ahead of
   the LP by a lead that grows from 0 on the first stage to a tenth of a mean all-max
   instruction on the last, ramped in over the first ``min(S, M)`` microbatches, so
   downstream stages keep a margin and upstream ones take the slow steps;
   `staggered_lead`), forwards without the cap, and backwards (no instruction starts
   earlier than in the LP's latest-start schedule); leftover slack is then reclaimed
   greedily (after dithering, first only where it lifts an instruction onto a hull
   vertex). A dense profile's sweep (coarsened hulls, `perseus.solver.lp.sweep_hulls`) is
   rounded the first and the last way only: on the 16-stage synthetic H100 profile the
   other two never lowered the worst deadline's energy against the exact sweep's frontier
   (16 × 128 and 16 × 256: the same worst, the mean +0.0005 % at most) and took a sixth to
   a fifth of the solve time. The ways are independent: on two cores two threads share
   them (numpy lets go of the GIL inside its loops), and each batch of plans is cut to its
   own Pareto front before it is merged, in one fixed order;
3. between consecutive targets' dithered plans, and later in every hole of the Pareto set
   wider than ``resolution_s``, plans are *mixed*: the latest instructions take the slower plan's
   options and the others the faster one's, then slack is reclaimed;
4. on small problems, a local search scores every plan one or two option changes away
   from a frontier plan (tiny instances then match brute force);
5. every plan is scored with the exact accounting (`SolverProblem.score`: ``T`` = longest
   path, ``E = Σ eᵢ + P·(S·T − Σ tᵢ)``), and the Pareto set is kept: time strictly
   increasing, energy strictly decreasing. Its first point is at ``T_min`` exactly (the
   all-fastest plan, or a cheaper plan with the same time).

The *reference* plan (every node at its reference option, the largest label: all-max
frequency) is reported beside the points as the baseline (`FrontierSolution.reference_*`).
Where profiled time is not monotone in the label (power-capped top clocks), ``T_min`` is
below the reference time ``T_ref``: the frontier then holds plans both faster and cheaper
than the reference. ``T_ref`` is a rounding target of its own and the cheapest point with
``T ≤ T_ref`` (the "no slowdown" plan) survives `max_points` thinning.

Every point carries the LP lower bound at its time: no plan that finishes within that
time can use less energy.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from perseus.errors import SolverError
from perseus.solver.lp import LPCurve, solve_lp_curve, sweep_hulls
from perseus.solver.pareto import ParetoStore, pareto_front
from perseus.solver.problem import SolverProblem
from perseus.solver.rounding import Rounder

__all__ = ["FrontierSolution", "compute_frontier", "staggered_lead"]

_TIME_RTOL = 1e-9
_BATCH = 4096
_BATCH_CELLS = 2**21
"""Plans rounded or scored together hold at most this many (node, plan) cells, so that a
batch's arrays stay ~16 MB each on big pipelines (512 plans at 4096 nodes). Small
pipelines round up to `_BATCH` plans at once: every topological level costs a few numpy
calls per batch, whatever its width (GPT-3 8 × 24: 1.14 → 0.87 s of solve)."""
_MAX_MIXES = 256
_POLISH_ROUNDS = 20
_FILL_ROUNDS = 2
_POLISH_COLUMNS = 4096
_SEGMENT_TARGETS = 256
_LEAD_FRACTION = 0.1
_DENSE_TARGET_GAP = 0.5
"""On dense profiles (`perseus.solver.lp.sweep_hulls` coarsened a hull), LP breakpoints
closer than this many resolutions to the last rounded target are not rounded."""
_DEFAULT_THREADS = 2
"""Rounding threads by default: a second core makes the rounding 1.4× faster (numpy lets
go of the GIL inside its loops, not between them); every thread holds a batch's arrays
(16 × 256's peak: 438 MB with one, 566 MB with two), so more would hold more memory at
once for less gain."""


class _Scored(NamedTuple):
    """A batch of candidate plans, scored, cut down to its own Pareto front (`pareto_front`:
    no other plan of the batch can survive merging), so it holds little memory while it
    waits for its turn to be merged."""

    count: int  # candidates scored
    time_s: np.ndarray
    energy_j: np.ndarray
    compute_j: np.ndarray
    choice: np.ndarray  # (n, kept) option indices


def _available_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class FrontierSolution:
    """The frontier's points, fastest first: time strictly increasing, energy decreasing.

    Arrays over the ``K`` points; `choice` is ``(n, K)``: each point's option index per node.
    `lower_bound_j` is the LP bound at each point's time: no plan that finishes within that
    time uses less energy.
    """

    time_s: np.ndarray
    energy_j: np.ndarray
    lower_bound_j: np.ndarray
    compute_energy_j: np.ndarray
    choice: np.ndarray
    lp_curve: LPCurve
    reference_time_s: float = math.nan
    """The reference (all-max) plan's exact iteration time: the baseline, not a point."""
    reference_energy_j: float = math.nan
    reference_compute_energy_j: float = math.nan
    stats: dict[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.time_s)


def staggered_lead(problem: SolverProblem, mean_instruction_s: float) -> np.ndarray:
    """Per-node lead (s) of the staggered dithering (`Rounder.follow_steps`).

    It grows linearly from 0 on the first resource to ``_LEAD_FRACTION`` of a mean
    all-max node on the last, times the node's `SolverProblem.lead_ramp` (for pipelines
    the ramp-in over the first ``R = min(S, M)`` microbatches: microbatch ``j`` gets
    ``(j + 1) / R`` of it). During the warm-up the first backwards of the late stages sit
    on the steepest part of their hulls (near the top clock a backward saves ~3 J per ms
    slower, a forward ~0.5 J): with the full lead there they run at the top clock and hand
    their time to the forwards after them; the ramp lets them keep it. (On the GPT-3 A40
    profile the ramp takes the worst 8 × 64 point from 0.60 % to 0.54 % above the LP
    bound, and the points above 0.5 % from 129 to 40.)
    """
    num_resources = problem.num_resources
    position = np.zeros(problem.n)
    for s, idx in enumerate(problem.resources):
        position[idx] = s / max(num_resources - 1, 1)
    return _LEAD_FRACTION * mean_instruction_s * position * problem.lead_ramp


def compute_frontier(
    problem: SolverProblem,
    *,
    progress: Callable[[float], None] | None = None,
    resolution_s: float | None = None,
    max_points: int | None = 500,
    threads: int | None = None,
) -> FrontierSolution:
    """Compute the time–energy frontier of one problem (see the module docstring).

    Args:
        problem: The DAG, its option tables and the blocking power.
        progress: Called with the fraction done (0..1) as the sweep proceeds.
        resolution_s: Time spacing of the plans built between LP breakpoints (and in
            any wider hole of the Pareto set); default ``(T_slowest − T_min) / 2000``.
        max_points: Keep at most this many points (spread evenly in time; the fastest, the
            slowest and the cheapest with ``T ≤ T_ref`` always kept); ``None`` keeps the
            whole Pareto set.
        threads: At most this many threads round an LP batch's targets, each rounding
            way in its own (there are four, two on dense profiles); default: two where
            this process may use two cores (`_DEFAULT_THREADS`). The frontier does not
            depend on it.
    """
    t0 = time.perf_counter()
    if max_points is not None and max_points < 2:
        raise SolverError(f"max_points must be at least 2 (or None for all), got {max_points!r}")
    if threads is not None and threads < 1:
        raise SolverError(f"threads must be at least 1 (or None for the default), got {threads!r}")
    max_threads = min(_DEFAULT_THREADS, _available_cores()) if threads is None else threads
    rounder = Rounder(problem)

    # The reference (all-max) plan: the baseline, and a candidate like any other.
    all_max = problem.reference_choice()
    ref_scores = problem.score(all_max[:, None])
    t_ref_arr, e_ref_arr, c_ref_arr = ref_scores
    t_ref = float(t_ref_arr[0])
    # The fastest plan: every node at its fastest option, whatever its label.
    fastest = problem.fastest_choice()
    fast_scores = problem.score(fastest[:, None])
    t_min = float(fast_scores[0][0])
    store = ParetoStore(problem.n, t_min)
    for choice, deadline, scores in ((all_max, t_ref, ref_scores), (fastest, t_min, fast_scores)):
        store.add(*scores, choice[:, None])
        anchored = rounder.anchor(choice, deadline)[:, None]  # same time, less energy
        store.add(*problem.score(anchored), anchored)
        times = problem.choices_to_arrays(choice)[0]
        reclaimed = rounder.round(times[:, None], np.array([deadline]))
        store.add(*problem.score(reclaimed), reclaimed)
    fast_times = problem.choices_to_arrays(all_max)[0]

    t_slow = float(
        problem.makespan(np.array([h.time_s[-1] for h in problem.hulls])[problem.type_of])
    )
    span = max(t_slow - t_min, 0.0)
    if resolution_s is None:
        resolution_s = span / 2000 if span > 0 else 1.0
    if not (math.isfinite(resolution_s) and resolution_s > 0):
        raise SolverError(
            f"resolution_s must be a positive number of seconds, got {resolution_s!r}"
        )

    # Dense profiles (`perseus.solver.lp.sweep_hulls` coarsened a hull) are rounded two
    # ways, measured ones four (module docstring).
    dense = bool(sweep_hulls(problem.hulls)[1].any())
    level = problem.level_of
    lead = staggered_lead(problem, float(np.mean(fast_times)))
    batch = int(min(_BATCH, max(64, _BATCH_CELLS // problem.n)))
    pending_d: list[np.ndarray] = []
    pending_t: list[float] = []
    carry: list[tuple[np.ndarray, float]] = []  # last rounded breakpoint (steps, time)
    counter = {"candidates": 7}

    def scored(steps: np.ndarray) -> _Scored:
        choice = rounder.options(steps)
        T, E, C = problem.score(choice, exact=False)
        front = pareto_front(T, E, t_min)
        return _Scored(steps.shape[1], T[front], E[front], C[front], choice[:, front])

    def add(plans: _Scored) -> None:
        store.add(plans.time_s, plans.energy_j, plans.compute_j, plans.choice)
        counter["candidates"] += plans.count

    def mixes(slow: np.ndarray, fast: np.ndarray, count: int) -> list[np.ndarray]:
        """`count` plans between two plans: the latest instructions (by topological
        generation) take the slower plan's options, the others the faster plan's."""
        diff = np.flatnonzero(slow != fast)
        if count <= 0 or len(diff) == 0:
            return []
        cuts = np.unique(np.quantile(level[diff], np.linspace(0, 1, count + 2)[1:-1]))
        return [np.where(level >= c, slow, fast) for c in cuts]

    def mixed(between: list[np.ndarray]) -> list[_Scored]:
        """Mixes, slack reclaimed (each keeps its time and lowers its energy), scored."""
        out = []
        for lo in range(0, len(between), batch):
            M = np.stack(between[lo : lo + batch], axis=1)
            rounder.reclaim(M, problem.makespan(rounder.times(M)))
            out.append(scored(M))
        return out

    def process() -> None:
        if not pending_t:
            return
        D = np.stack(pending_d, axis=1)
        T = np.array(pending_t)
        previous = list(carry)

        def dithered() -> tuple[np.ndarray, list[_Scored]]:
            """The dithering rounding and the mixes between its consecutive targets; the
            last target's plan (the next batch mixes from it)."""
            steps = rounder.follow_steps(D, T, capped=True, vertices_first=True)
            seq = [*previous, *((steps[:, j], T[j]) for j in range(len(T)))]
            between: list[np.ndarray] = []
            for (slow, t_slow_bp), (fast, t_fast_bp) in itertools.pairwise(seq):
                count = min(_MAX_MIXES, math.ceil((t_slow_bp - t_fast_bp) / resolution_s) - 1)
                between += mixes(slow, fast, count)
            return steps[:, -1].copy(), [scored(steps), *mixed(between)]

        others: list[Callable[[], np.ndarray]] = []
        if not dense:  # dense sweeps: these two never lowered the worst deadline (docstring)
            others.append(
                lambda: rounder.follow_steps(D, T, capped=True, vertices_first=True, lead=lead)
            )
            others.append(lambda: rounder.follow_steps(D, T))
        others.append(lambda: rounder.follow_steps_backward(D, T))
        # The roundings are independent: with a second core they run side by side (numpy
        # lets go of the GIL inside its loops). Their plans are added in one fixed order,
        # whichever finishes first, so the frontier is the same either way.
        workers = min(1 + len(others), max_threads)
        if workers < 2:
            last, first = dithered()
            rest = [scored(way()) for way in others]
        else:
            with ThreadPoolExecutor(workers, thread_name_prefix="perseus-rounding") as pool:
                job = pool.submit(dithered)
                rest = list(pool.map(lambda way: scored(way()), others))
                last, first = job.result()
        for plans in (first[0], *rest, *first[1:]):
            add(plans)
        carry[:] = [(last, float(T[-1]))]
        pending_d.clear()
        pending_t.clear()

    def target(d: np.ndarray, T: float) -> None:
        pending_d.append(d)
        pending_t.append(T)
        if len(pending_t) >= batch:
            process()

    state: dict[str, tuple[float, np.ndarray]] = {}
    lp_span = max(t_slow - t_min, 1e-300)

    # A dense profile's sweep has several breakpoints per resolution step, whose plans
    # differ by a step or two: rounding one per half resolution loses < 0.03 % of energy
    # at any deadline on the 16-stage synthetic H100 profile and halves the rounding work.
    # Measured profiles keep every breakpoint (thinning cost up to 0.09 % on GPT-3 8 × 64).
    min_gap = _DENSE_TARGET_GAP * resolution_s if dense else 0.0
    last: dict[str, float] = {"target": math.inf}
    skipped: list[tuple[np.ndarray, float]] = []

    def on_breakpoint(lam: float, cost: float, d: np.ndarray) -> bool:
        prev = state.get("prev")
        if prev is not None:
            lam_prev, d_prev = prev
            # Inside a long LP segment the optimum moves linearly from one breakpoint's
            # durations to the other's: round interior LP solutions too, slowest first
            # (targets are mixed in the order they come), down to the minimum time.
            count = min(_SEGMENT_TARGETS, math.ceil((lam_prev - lam) / resolution_s) - 1)
            mids = [lam + f * (lam_prev - lam) for f in np.linspace(1, 0, count + 2)[1:-1]]
            if lam < t_ref < lam_prev:  # the all-max time falls inside this LP segment
                mids = sorted([*mids, t_ref], reverse=True)
            step = d_prev - d
            for t_mid in mids:
                w = (t_mid - lam) / (lam_prev - lam)
                target(d + w * step, t_mid)
                last["target"] = t_mid
        if last["target"] - lam >= min_gap:
            target(d.copy(), lam)
            last["target"] = lam
            skipped.clear()
        else:
            skipped[:] = [(d.copy(), lam)]
        state["prev"] = (lam, d.copy())
        if progress is not None:
            progress(0.95 * min(1.0, max(0.0, (t_slow - lam) / lp_span)))
        return False

    curve = solve_lp_curve(problem, on_breakpoint=on_breakpoint)
    for d, lam in skipped:  # the fastest breakpoint is always a target
        target(d, lam)
    process()

    # Fill the holes of the Pareto set: mix the two plans around every gap wider than the
    # resolution (each side is a real plan, so mixes interpolate between good plans even
    # where rounding one LP breakpoint went badly).
    for _ in range(_FILL_ROUNDS):
        gaps = np.flatnonzero(np.diff(store.time) > 2 * resolution_s)
        between = []
        for g in gaps:
            count = min(
                _MAX_MIXES, math.ceil((store.time[g + 1] - store.time[g]) / resolution_s) - 1
            )
            slow = rounder.steps_of(store.choice[g + 1].astype(np.int64))
            fast = rounder.steps_of(store.choice[g].astype(np.int64))
            if slow is not None and fast is not None:
                between += mixes(slow, fast, count)
        if not between:
            break
        for plans in mixed(between):
            add(plans)

    # Local search for small problems: every plan one or two option changes away from a
    # frontier plan is scored exactly; repeat while the Pareto set improves.
    for _ in range(_POLISH_ROUNDS):
        before = (store.time.copy(), store.energy.copy())
        grown = False
        for row in store.choice.copy():
            steps = rounder.steps_of(row.astype(np.int64))
            if steps is None:
                continue
            variants = rounder.neighbours(steps, _POLISH_COLUMNS)
            if variants is None:
                break
            add(scored(variants))
            grown = True
        if not grown or (
            len(store.time) == len(before[0])
            and np.array_equal(store.time, before[0])
            and np.array_equal(store.energy, before[1])
        ):
            break

    # Score the survivors with evaluate's exact summation order (per plan, whatever the
    # block), then re-filter.
    final = ParetoStore(problem.n, t_min)
    for lo in range(0, len(store.time), batch):
        block = store.choice[lo : lo + batch].T.astype(np.int64)
        final.add(*problem.score(block, exact=True), block)
    store = final

    idx = np.arange(len(store.time))
    if max_points is not None and len(idx) > max_points:
        want = np.linspace(store.time[0], store.time[-1], max_points)
        picks = np.searchsorted(store.time, want)
        picks = np.clip(picks, 0, len(idx) - 1)
        # The cheapest point no slower than the reference (energy falls with time).
        no_slowdown = np.searchsorted(store.time, t_ref * (1 + _TIME_RTOL), side="right") - 1
        idx = np.unique(np.concatenate([[0, no_slowdown, len(idx) - 1], picks]))
    bounds = curve.lower_bound(store.time[idx])
    energy = store.energy[idx]
    # A plan at an LP vertex can meet the bound up to rounding noise.
    bounds = np.where(bounds <= energy * (1 + 1e-9), np.minimum(bounds, energy), bounds)
    if store.time[0] != t_min:  # pragma: no cover - the all-fastest plan is a candidate
        raise SolverError("Internal error: the frontier lost the all-fastest plan")
    stats = {
        "lp_breakpoints": float(len(curve.time_s)),
        "candidates": float(counter["candidates"]),
        "pareto_points": float(len(store.time)),
        "wall_s": time.perf_counter() - t0,
    }
    if progress is not None:
        progress(1.0)
    return FrontierSolution(
        time_s=store.time[idx],
        energy_j=energy,
        lower_bound_j=bounds,
        compute_energy_j=store.compute[idx],
        choice=store.choice[idx].T,
        lp_curve=curve,
        reference_time_s=t_ref,
        reference_energy_j=float(e_ref_arr[0]),
        reference_compute_energy_j=float(c_ref_arr[0]),
        stats=stats,
    )
