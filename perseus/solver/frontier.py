"""The time–energy frontier: exact LP sweep → discrete plans → exact scores → Pareto set.

`solve_frontier` runs, for one profile, schedule and blocking power ``P``:

1. the parametric LP (`perseus.solver.lp`) from the slowest useful iteration time down to
   the all-max-frequency time ``T_fast``, breakpoint to breakpoint;
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
   vertex);
3. between consecutive targets' dithered plans, and later in every hole of the Pareto set
   wider than ``resolution_s``, plans are *mixed*: the latest instructions take the slower plan's
   options and the others the faster one's, then slack is reclaimed;
4. on small problems, a local search scores every plan one or two option changes away
   from a frontier plan (tiny instances then match brute force);
5. every plan is scored with the exact accounting of `perseus.plan.evaluate`
   (``T`` = longest path, ``E = Σ eᵢ + P·(S·T − Σ tᵢ)``), vectorised and bit-identical,
   and the Pareto set is kept: time strictly increasing, energy strictly decreasing. Its
   first point is at ``T_fast`` exactly (the all-max plan, or a cheaper plan with the
   same time), so its energy is at most the all-max energy. Plans faster than all-max
   (possible when profiled time is not monotone in frequency, e.g. power-capped top
   clocks) are not reported; each is slowed to just above ``T_fast`` instead
   (`Rounder.stretch`), which keeps most of its saving.

Every point carries the LP lower bound at its time: no plan that finishes within that
time can use less energy.
"""

from __future__ import annotations

import csv
import itertools
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from perseus.domain.plan import Evaluation, Plan
from perseus.domain.profile import InstructionProfile
from perseus.domain.schedule import PipelineSchedule
from perseus.errors import PlanError, SolverError
from perseus.io.plan_file import load_plan, save_plan
from perseus.memory import memory_shortfall
from perseus.solver.lp import LPCurve, solve_lp_curve
from perseus.solver.problem import SolverProblem
from perseus.solver.rounding import Rounder

__all__ = [
    "FRONTIER_COLUMNS",
    "Frontier",
    "FrontierPoint",
    "FrontierTable",
    "check_frontier_memory",
    "choose_index",
    "read_frontier_table",
    "solve_frontier",
    "staggered_lead",
]

FRONTIER_COLUMNS = ("index", "iteration_time", "energy", "lower_bound", "plan")
_TIME_RTOL = 1e-9
_BATCH = 512
_MAX_MIXES = 256
_POLISH_ROUNDS = 20
_FILL_ROUNDS = 2
_POLISH_COLUMNS = 4096
_SEGMENT_TARGETS = 256
_LEAD_FRACTION = 0.1
_BYTES_PER_INSTRUCTION = 100 * 1024
"""Peak memory of a whole-frontier solve per instruction, measured at 8×64 and 8×512 (it
grows slowly with size, so this is a floor)."""


def choose_index(
    times_s: Sequence[float],
    energies_j: Sequence[float],
    *,
    max_slowdown: float | None = None,
    deadline_s: float | None = None,
) -> int:
    """Index of the minimum-energy point with ``T ≤ (1 + max_slowdown)·T_fastest`` or ``T ≤ deadline_s``.

    The one choice rule, used by `Frontier.choose` and by `perseus choose` (which reads only
    ``frontier.csv``). Points are fastest first; ties in energy go to the faster point.
    """
    if (max_slowdown is None) == (deadline_s is None):
        raise SolverError("Pass exactly one of max_slowdown= or deadline_s= to choose a plan")
    if not times_s:
        raise SolverError("The frontier has no points")
    fastest = times_s[0]
    if max_slowdown is not None:
        if not (math.isfinite(max_slowdown) and max_slowdown >= 0):
            raise SolverError(
                f"max_slowdown must be a finite fraction >= 0 (0.05 = 5 % slower), got {max_slowdown!r}"
            )
        limit = fastest * (1 + max_slowdown)
    else:
        assert deadline_s is not None
        if not math.isfinite(deadline_s):
            raise SolverError(f"deadline_s must be a finite number of seconds, got {deadline_s!r}")
        limit = deadline_s
    fits = [k for k, t in enumerate(times_s) if t <= limit * (1 + _TIME_RTOL)]
    if not fits:
        raise SolverError(
            f"No plan meets an iteration time of {limit:.6f} s: the fastest plan takes "
            f"{fastest:.6f} s (all GPUs at maximum frequency); relax the deadline"
        )
    return min(fits, key=lambda k: energies_j[k])


class FrontierPoint:
    """One plan of the frontier: its exact time and energy, the LP bound, its frequencies.

    `frequencies` is per stage, in that stage's execution order (the plan-file layout).
    """

    __slots__ = ("_freqs", "compute_energy_j", "energy_j", "iteration_time_s", "lower_bound_j")

    def __init__(
        self,
        iteration_time_s: float,
        energy_j: float,
        lower_bound_j: float,
        frequencies: Sequence[Sequence[int]],
        *,
        compute_energy_j: float = math.nan,
    ):
        self.iteration_time_s = float(iteration_time_s)
        self.energy_j = float(energy_j)
        self.lower_bound_j = float(lower_bound_j)
        self.compute_energy_j = float(compute_energy_j)
        # Compact storage: frontiers of big pipelines hold thousands of plans.
        self._freqs = tuple(np.asarray(f, dtype=np.int32) for f in frequencies)

    @property
    def frequencies(self) -> list[list[int]]:
        """Per stage, the frequency (MHz) of each instruction in execution order."""
        return [f.tolist() for f in self._freqs]

    @property
    def gap(self) -> float:
        """Relative energy above the LP lower bound."""
        return self.energy_j / self.lower_bound_j - 1 if self.lower_bound_j > 0 else math.nan

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FrontierPoint):
            return NotImplemented
        return (
            self.iteration_time_s == other.iteration_time_s
            and self.energy_j == other.energy_j
            and self.lower_bound_j == other.lower_bound_j
            and len(self._freqs) == len(other._freqs)
            and all(np.array_equal(a, b) for a, b in zip(self._freqs, other._freqs, strict=True))
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"FrontierPoint(iteration_time_s={self.iteration_time_s:.6f}, "
            f"energy_j={self.energy_j:.3f}, lower_bound_j={self.lower_bound_j:.3f})"
        )


class Frontier:
    """A Pareto set of plans, fastest first. Build with `solve_frontier` or `Frontier.read`."""

    def __init__(
        self,
        points: list[FrontierPoint],
        *,
        schedule: PipelineSchedule,
        p2p_power_w: float,
        lp_curve: LPCurve | None = None,
        stats: dict[str, float] | None = None,
    ):
        if not points:
            raise SolverError("A frontier needs at least one point")
        self.points = points
        self.schedule = schedule
        self.p2p_power_w = float(p2p_power_w)
        self.lp_curve = lp_curve
        self.stats = dict(stats or {})

    def __len__(self) -> int:
        return len(self.points)

    def __repr__(self) -> str:
        return (
            f"Frontier({len(self.points)} points, T {self.points[0].iteration_time_s:.4f}"
            f"..{self.points[-1].iteration_time_s:.4f} s)"
        )

    # ------------------------------------------------------------------ choosing
    def choose(
        self, *, max_slowdown: float | None = None, deadline_s: float | None = None
    ) -> FrontierPoint:
        """The minimum-energy plan with ``T ≤ (1 + max_slowdown)·T_fastest`` or ``T ≤ deadline_s``.

        Times are compared with a relative tolerance of 1e-9.
        """
        k = choose_index(
            [p.iteration_time_s for p in self.points],
            [p.energy_j for p in self.points],
            max_slowdown=max_slowdown,
            deadline_s=deadline_s,
        )
        return self.points[k]

    # ------------------------------------------------------------------ files
    def write(self, out_dir: str | os.PathLike[str]) -> Path:
        """Write ``frontier.csv`` and ``plans/plan_NNNNN.json`` (one Plan file per point)."""
        out = Path(out_dir)
        plans = out / "plans"
        plans.mkdir(parents=True, exist_ok=True)
        for old in plans.glob("plan_*.json"):
            old.unlink()
        rows = []
        for k, p in enumerate(self.points):
            rel = f"plans/plan_{k:05d}.json"
            compute = p.compute_energy_j if math.isfinite(p.compute_energy_j) else math.nan
            evaluation = Evaluation(
                iteration_time_s=p.iteration_time_s,
                energy_j=p.energy_j,
                compute_energy_j=compute,
                blocking_energy_j=p.energy_j - compute,
            )
            plan = Plan.from_frequencies(
                self.schedule, p.frequencies, p2p_power_w=self.p2p_power_w, evaluation=evaluation
            )
            save_plan(plan, out / rel)
            rows.append((k, repr(p.iteration_time_s), repr(p.energy_j), repr(p.lower_bound_j), rel))
        tmp = out / "frontier.csv.tmp"
        with tmp.open("w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(FRONTIER_COLUMNS)
            writer.writerows(rows)
        tmp.replace(out / "frontier.csv")
        return out / "frontier.csv"

    @classmethod
    def read(cls, out_dir: str | os.PathLike[str]) -> Frontier:
        """Read a frontier written by `write` (plans are validated on load), points in
        ``index`` order whatever the file's row order (see `read_frontier_table`)."""
        out = Path(out_dir)
        table = read_frontier_table(out)
        points: list[FrontierPoint] = []
        schedule: PipelineSchedule | None = None
        p2p = math.nan
        for t_s, e_j, lb_j, rel in zip(
            table.iteration_time, table.energy, table.lower_bound, table.plan, strict=True
        ):
            plan = load_plan(out / rel)
            if schedule is None:
                schedule = plan.pipeline_schedule()
                p2p = plan.p2p_power
            points.append(
                FrontierPoint(t_s, e_j, lb_j, plan.stage_frequencies(), compute_energy_j=math.nan)
            )
        assert schedule is not None  # read_frontier_table refuses a table without rows
        return cls(points, schedule=schedule, p2p_power_w=p2p)


class FrontierTable(NamedTuple):
    """The columns of a ``frontier.csv`` (see `FRONTIER_COLUMNS`), rows in ``index`` order."""

    index: list[int]
    iteration_time: list[float]
    energy: list[float]
    lower_bound: list[float]
    plan: list[str]
    """Plan paths relative to the frontier's directory."""


def read_frontier_table(out_dir: str | os.PathLike[str]) -> FrontierTable:
    """Read and check ``DIR/frontier.csv`` without loading its plans.

    Rows come back sorted by ``index`` (stable), whatever their order in the file, so that
    every reader (`perseus choose`, `Frontier.read`, the plot) breaks ties the same way.

    Raises `PlanError` naming the file (and line) when it is missing, not a CSV, lacks a
    column, lists no plans, or has a value that is not a finite number or a plan path.
    """
    path = Path(out_dir) / "frontier.csv"
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.reader(fh)
            header = next(reader, None) or []
            rows = list(reader)
    except OSError as exc:
        raise PlanError(
            f"Cannot read frontier {str(path)!r}: {exc.strerror or exc}; run "
            f"`perseus solve ... --out {out_dir}` first"
        ) from exc
    except (UnicodeDecodeError, csv.Error) as exc:
        raise PlanError(f"{str(path)!r} is not a frontier CSV ({exc})") from None
    missing = [c for c in FRONTIER_COLUMNS if c not in header]
    if missing:
        raise PlanError(
            f"{str(path)!r} lacks column(s) {', '.join(missing)}; expected "
            f"{','.join(FRONTIER_COLUMNS)}"
        )
    if not rows:
        raise PlanError(f"{str(path)!r} lists no plans")
    where = {c: header.index(c) for c in FRONTIER_COLUMNS}
    columns: dict[str, list] = {c: [] for c in FRONTIER_COLUMNS}
    for line, row in enumerate(rows, start=2):
        if len(row) != len(header):
            raise PlanError(
                f"{str(path)!r} line {line} has {len(row)} field(s), the header {len(header)}"
            )
        for column in FRONTIER_COLUMNS[:-1]:
            text = row[where[column]]
            try:
                value = float(text)
            except ValueError:
                value = math.nan
            if not math.isfinite(value) or (column == "index" and value != int(value)):
                kind = "an integer" if column == "index" else "a finite number"
                raise PlanError(f"{str(path)!r} line {line}: {column} must be {kind}, got {text!r}")
            columns[column].append(int(value) if column == "index" else value)
        plan = row[where["plan"]].strip()
        if not plan:
            raise PlanError(f"{str(path)!r} line {line}: no plan path")
        columns["plan"].append(plan)
    order = sorted(range(len(rows)), key=columns["index"].__getitem__)
    return FrontierTable(**{c: [values[k] for k in order] for c, values in columns.items()})


class _ParetoStore:
    """Candidate plans (option indices, one row per plan) kept Pareto-optimal."""

    def __init__(self, n: int, t_floor: float):
        self.t_floor = t_floor
        self.time = np.empty(0)
        self.energy = np.empty(0)
        self.compute = np.empty(0)
        self.choice = np.empty((0, n), dtype=np.int16)

    def add(
        self, time_s: np.ndarray, energy_j: np.ndarray, compute_j: np.ndarray, choice: np.ndarray
    ) -> None:
        """Merge plans ``choice`` (``(n, K)`` option indices) with their exact scores."""
        keep = time_s >= self.t_floor
        t = np.concatenate([self.time, time_s[keep]])
        e = np.concatenate([self.energy, energy_j[keep]])
        c = np.concatenate([self.compute, compute_j[keep]])
        order = np.lexsort((e, t))
        best_before = np.concatenate([[np.inf], np.minimum.accumulate(e[order])[:-1]])
        kept = order[e[order] < best_before]
        old = len(self.time)
        new_rows = choice[:, keep].T.astype(np.int16)
        from_old = kept[kept < old]
        from_new = kept[kept >= old] - old
        rows = np.concatenate([self.choice[from_old], new_rows[from_new]])
        # Restore time order (old and new survivors interleave).
        merged_t = np.concatenate([t[from_old], t[old + from_new]])
        resort = np.argsort(merged_t, kind="stable")
        self.time = merged_t[resort]
        self.energy = np.concatenate([e[from_old], e[old + from_new]])[resort]
        self.compute = np.concatenate([c[from_old], c[old + from_new]])[resort]
        self.choice = rows[resort]


def check_frontier_memory(num_instructions: int, schedule_name: str) -> None:
    """Refuse a frontier that cannot fit in this machine's available memory.

    `solve_frontier` calls it first; `perseus solve` (before building the schedule) and the
    `Perseus` scheduler (at registration) call it earlier, so that a job too big to solve
    fails at once instead of after a schedule build or a profiling sweep.

    Raises:
        SolverError: ``num_instructions`` × ~100 KB is more than the available memory.
    """
    short = memory_shortfall(
        num_instructions * _BYTES_PER_INSTRUCTION,
        f"The frontier of {num_instructions:,} instructions ({schedule_name})",
    )
    if short:
        raise SolverError(f"{short}; solve fewer microbatches or stages")


def staggered_lead(problem: SolverProblem, mean_instruction_s: float) -> np.ndarray:
    """Per-instruction lead (s) of the staggered dithering (`Rounder.follow_steps`).

    It grows linearly from 0 on the first stage to ``_LEAD_FRACTION`` of a mean all-max
    instruction on the last, and ramps in over the first ``R = min(S, M)`` microbatches
    (microbatch ``j`` gets ``(j + 1) / R`` of it). During the warm-up the first backwards
    of the late stages sit on the steepest part of their hulls (near the top clock a
    backward saves ~3 J per ms slower, a forward ~0.5 J): with the full lead there they run
    at the top clock and hand their time to the forwards after them; the ramp lets them
    keep it. (On the GPT-3 A40 profile the ramp takes the worst 8 × 64 point from 0.60 % to
    0.54 % above the LP bound, and the points above 0.5 % from 129 to 40.)
    """
    num_stages = len(problem.stage_index)
    stage_of = np.empty(problem.n)
    for s, idx in enumerate(problem.stage_index):
        stage_of[idx] = s / max(num_stages - 1, 1)
    microbatch = np.array([ins.microbatch for ins in problem.instructions], dtype=float)
    ramp_length = min(num_stages, int(microbatch.max()) + 1)
    ramp = np.minimum(1.0, (microbatch + 1) / ramp_length)
    return _LEAD_FRACTION * mean_instruction_s * stage_of * ramp


def solve_frontier(
    profile: InstructionProfile,
    schedule: PipelineSchedule,
    *,
    p2p_power_w: float,
    progress: Callable[[float], None] | None = None,
    resolution_s: float | None = None,
    max_points: int | None = 500,
) -> Frontier:
    """Compute the time–energy frontier of one pipeline (see the module docstring).

    Args:
        profile: Profiled time and energy of every (stage, instruction, frequency).
        schedule: The pipeline schedule whose DAG is planned.
        p2p_power_w: Power a GPU draws while blocked on P2P communication or idle.
        progress: Called with the fraction done (0..1) as the sweep proceeds.
        resolution_s: Time spacing of the plans built between LP breakpoints (and in
            any wider hole of the Pareto set); default ``(T_slowest − T_fast) / 2000``.
        max_points: Keep at most this many points (spread evenly in time, fastest and
            slowest always kept); ``None`` keeps the whole Pareto set.
    """
    t0 = time.perf_counter()
    if max_points is not None and max_points < 2:
        raise SolverError(f"max_points must be at least 2 (or None for all), got {max_points!r}")
    check_frontier_memory(schedule.num_instructions, schedule.name)
    problem = SolverProblem.build(profile, schedule, p2p_power_w=p2p_power_w)
    rounder = Rounder(problem)

    all_max = problem.max_frequency_choice()
    t_fast_arr, e_fast_arr, c_fast_arr = problem.score(all_max[:, None])
    t_fast = float(t_fast_arr[0])
    store = _ParetoStore(problem.n, t_fast)
    store.add(t_fast_arr, e_fast_arr, c_fast_arr, all_max[:, None])
    anchored = rounder.anchor(all_max, t_fast)[:, None]  # same time, less energy
    store.add(*problem.score(anchored), anchored)
    fast_times = problem.choices_to_arrays(all_max)[0]
    reclaimed = rounder.round(fast_times[:, None], np.array([t_fast]))
    store.add(*problem.score(reclaimed), reclaimed)

    t_slow = float(
        problem.makespan(np.array([h.time_s[-1] for h in problem.hulls])[problem.type_of])
    )
    span = max(t_slow - t_fast, 0.0)
    if resolution_s is None:
        resolution_s = span / 2000 if span > 0 else 1.0
    if not (math.isfinite(resolution_s) and resolution_s > 0):
        raise SolverError(
            f"resolution_s must be a positive number of seconds, got {resolution_s!r}"
        )

    level = problem.level_of
    lead = staggered_lead(problem, float(np.mean(fast_times)))
    pending_d: list[np.ndarray] = []
    pending_t: list[float] = []
    carry: list[tuple[np.ndarray, float]] = []  # last rounded breakpoint (steps, time)
    counter = {"candidates": 3}

    def add(steps: np.ndarray) -> np.ndarray:
        choice = rounder.options(steps)
        T, E, C = problem.score(choice, exact=False)
        store.add(T, E, C, choice)
        counter["candidates"] += steps.shape[1]
        faster = np.less(T, t_fast)
        if faster.any():
            # Plans faster than all-max exist where profiled time is not monotone in
            # frequency (power-capped top clocks). They are not reported, but slowed to
            # just above T_fast they can be much cheaper than the all-max-time plans.
            stretched = rounder.options(rounder.stretch(steps[:, faster], t_fast))
            store.add(*problem.score(stretched, exact=False), stretched)
        return T

    def mixes(slow: np.ndarray, fast: np.ndarray, count: int) -> list[np.ndarray]:
        """`count` plans between two plans: the latest instructions (by topological
        generation) take the slower plan's options, the others the faster plan's."""
        diff = np.flatnonzero(slow != fast)
        if count <= 0 or len(diff) == 0:
            return []
        cuts = np.unique(np.quantile(level[diff], np.linspace(0, 1, count + 2)[1:-1]))
        return [np.where(level >= c, slow, fast) for c in cuts]

    def process() -> None:
        if not pending_t:
            return
        D = np.stack(pending_d, axis=1)
        T = np.array(pending_t)
        # Dithering rounding first: it is the one mixed between targets.
        steps = rounder.follow_steps(D, T, capped=True, vertices_first=True)
        add(steps)
        add(rounder.follow_steps(D, T, capped=True, vertices_first=True, lead=lead))
        add(rounder.follow_steps(D, T))
        add(rounder.follow_steps_backward(D, T))
        seq = [*carry, *((steps[:, j], T[j]) for j in range(len(T)))]
        between: list[np.ndarray] = []
        for (slow, t_slow_bp), (fast, t_fast_bp) in itertools.pairwise(seq):
            count = min(_MAX_MIXES, math.ceil((t_slow_bp - t_fast_bp) / resolution_s) - 1)
            between += mixes(slow, fast, count)
        for lo in range(0, len(between), _BATCH):
            M = np.stack(between[lo : lo + _BATCH], axis=1)
            T_mix = problem.makespan(rounder.times(M))
            rounder.reclaim(M, T_mix)  # keeps each mix's time, lowers its energy
            add(M)
        carry[:] = [(steps[:, -1].copy(), float(T[-1]))]
        pending_d.clear()
        pending_t.clear()

    def target(d: np.ndarray, T: float) -> None:
        pending_d.append(d)
        pending_t.append(T)
        if len(pending_t) >= _BATCH:
            process()

    state: dict[str, tuple[float, np.ndarray, float]] = {}
    lp_span = max(t_slow - t_fast, 1e-300)

    def on_breakpoint(lam: float, cost: float, d: np.ndarray) -> bool:
        prev = state.get("prev")
        energy = cost + problem.p2p_power_w * problem.schedule.num_stages * lam
        if prev is not None:
            lam_prev, d_prev, energy_prev = prev
            # Inside a long LP segment the optimum moves linearly from one breakpoint's
            # durations to the other's: round interior LP solutions too, slowest first
            # (targets are mixed in the order they come), down to the all-max time.
            lo_t = max(lam, t_fast)
            count = min(_SEGMENT_TARGETS, math.ceil((lam_prev - lo_t) / resolution_s) - 1)
            for frac in np.linspace(1, 0, count + 2)[1:-1] if count > 0 else []:
                t_mid = lo_t + frac * (lam_prev - lo_t)
                w = (t_mid - lam) / (lam_prev - lam)
                target(d + w * (d_prev - d), t_mid)
            if lam < t_fast < lam_prev:  # the all-max time falls inside this LP segment
                w = (t_fast - lam) / (lam_prev - lam)
                target(d + w * (d_prev - d), t_fast)
            if lam < t_fast and energy >= energy_prev:
                return True  # convex: faster LP points only cost more; done
        if lam >= t_fast * (1 - _TIME_RTOL):
            target(d.copy(), max(lam, t_fast))
        state["prev"] = (lam, d.copy(), energy)
        if progress is not None:
            progress(0.95 * min(1.0, max(0.0, (t_slow - lam) / lp_span)))
        return False

    curve = solve_lp_curve(problem, on_breakpoint=on_breakpoint)
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
        for lo in range(0, len(between), _BATCH):
            M = np.stack(between[lo : lo + _BATCH], axis=1)
            rounder.reclaim(M, problem.makespan(rounder.times(M)))
            add(M)

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
            add(variants)
            grown = True
        if not grown or (
            len(store.time) == len(before[0])
            and np.array_equal(store.time, before[0])
            and np.array_equal(store.energy, before[1])
        ):
            break

    # Score the survivors with evaluate's exact summation order, then re-filter.
    final = _ParetoStore(problem.n, t_fast)
    for lo in range(0, len(store.time), 4 * _BATCH):
        block = store.choice[lo : lo + 4 * _BATCH].T.astype(np.int64)
        final.add(*problem.score(block, exact=True), block)
    store = final

    idx = np.arange(len(store.time))
    if max_points is not None and len(idx) > max_points:
        want = np.linspace(store.time[0], store.time[-1], max_points)
        picks = np.searchsorted(store.time, want)
        picks = np.clip(picks, 0, len(idx) - 1)
        idx = np.unique(np.concatenate([[0, len(idx) - 1], picks]))
    bounds = curve.lower_bound(store.time[idx])
    # Every kept plan's frequencies at once (n, points), split per stage below: one
    # gather instead of a Python list per plan (thousands of plans on big pipelines).
    freqs = problem.choices_to_frequencies(store.choice[idx].T).astype(np.int32)
    points = [
        FrontierPoint(
            float(store.time[k]),
            float(store.energy[k]),
            # A plan at an LP vertex can meet the bound up to rounding noise.
            float(min(b, store.energy[k]) if b <= store.energy[k] * (1 + 1e-9) else b),
            [freqs[stage, j] for stage in problem.stage_index],
            compute_energy_j=float(store.compute[k]),
        )
        for j, (k, b) in enumerate(zip(idx, bounds, strict=True))
    ]
    if points[0].iteration_time_s != t_fast:  # pragma: no cover - the all-max plan is a candidate
        raise SolverError("Internal error: the frontier lost the all-max-frequency plan")
    stats = {
        "lp_breakpoints": float(len(curve.time_s)),
        "candidates": float(counter["candidates"]),
        "pareto_points": float(len(store.time)),
        "wall_s": time.perf_counter() - t0,
    }
    if progress is not None:
        progress(1.0)
    return Frontier(points, schedule=schedule, p2p_power_w=p2p_power_w, lp_curve=curve, stats=stats)
