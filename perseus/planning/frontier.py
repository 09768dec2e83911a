"""The frontier of one pipeline: the generic solver's points as domain plans.

`solve_frontier` lays the profile and schedule out for the solver
(`perseus.planning.problem.PipelineProblem`), runs `perseus.solver.compute_frontier` and
turns every point's option choice back into per-stage frequencies. `Frontier.write` and
`Frontier.read` go through `perseus.io.frontier_dir`.

The frontier starts at the minimum iteration time over all profiled clocks. The all-max
plan (`Frontier.all_max`) is the baseline: slowdowns are measured against its time, so
"no slowdown" (``max_slowdown=0``) is the cheapest plan with ``T ≤ T(all-max)`` whatever
clocks it uses, and plans faster than all-max (power-capped top clocks) have a negative
slowdown.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from perseus.domain.plan import Evaluation, Plan
from perseus.domain.profile import InstructionProfile
from perseus.domain.schedule import PipelineSchedule
from perseus.errors import ScheduleError, SolverError
from perseus.io.frontier_dir import (
    CompactPlans,
    FrontierRow,
    FrontierTable,
    read_compact_plans,
    read_frontier_dir,
    read_frontier_table,
    read_reference_plan,
    write_compact_frontier_dir,
    write_frontier_dir,
)
from perseus.memory import memory_shortfall
from perseus.planning.choice import choose_index
from perseus.planning.problem import PipelineProblem
from perseus.planning.stage_clocks import stage_clock_plans
from perseus.solver.frontier import compute_frontier
from perseus.solver.lp import LPCurve

__all__ = ["Frontier", "FrontierPoint", "check_frontier_memory", "solve_frontier"]

_BYTES_PER_INSTRUCTION = 100 * 1024
"""Peak memory of a whole-frontier solve per instruction, measured at 8×64 and 8×512 (it
grows slowly with size, so this is a floor)."""


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
    """A Pareto set of plans, fastest first. Build with `solve_frontier` or `Frontier.read`.

    `all_max` is the reference plan (every instruction at its maximum clock), the baseline
    slowdowns are measured against; it need not be on the frontier (where the top clock
    is power-capped, cheaper plans are faster). ``None`` (frontiers written before it was
    kept): the fastest point stands for it.
    """

    def __init__(
        self,
        points: list[FrontierPoint],
        *,
        schedule: PipelineSchedule,
        p2p_power_w: float,
        lp_curve: LPCurve | None = None,
        stats: dict[str, float] | None = None,
        all_max: FrontierPoint | None = None,
        emulated: bool = False,
        switch_latency_s: float = 0.0,
        hop_latency_s: float = 0.0,
    ):
        if not points:
            raise SolverError("A frontier needs at least one point")
        self.points = points
        self.all_max = all_max
        self.schedule = schedule
        self.p2p_power_w = float(p2p_power_w)
        self.lp_curve = lp_curve
        self.stats = dict(stats or {})
        self.emulated = emulated
        """Solved from an emulated GPU's profile: its plans say so."""
        self.switch_latency_s = float(switch_latency_s)
        """Clock switching latency the points' numbers account for (0: changes are free)."""
        self.hop_latency_s = float(hop_latency_s)
        """P2P hop latency between ranks the points were solved and scored with (0: free)."""

    def __len__(self) -> int:
        return len(self.points)

    def __repr__(self) -> str:
        return (
            f"Frontier({len(self.points)} points, T {self.points[0].iteration_time_s:.4f}"
            f"..{self.points[-1].iteration_time_s:.4f} s)"
        )

    # ------------------------------------------------------------------ choosing
    @property
    def reference_time_s(self) -> float:
        """The all-max plan's iteration time (the fastest point's when it is unknown)."""
        base = self.all_max if self.all_max is not None else self.points[0]
        return base.iteration_time_s

    def choose(
        self, *, max_slowdown: float | None = None, deadline_s: float | None = None
    ) -> FrontierPoint:
        """The minimum-energy plan with ``T ≤ (1 + max_slowdown)·T_all-max`` or ``T ≤ deadline_s``.

        ``max_slowdown=0`` is the cheapest plan no slower than all-max. Times are compared
        with a relative tolerance of 1e-9.
        """
        k = choose_index(
            [p.iteration_time_s for p in self.points],
            [p.energy_j for p in self.points],
            max_slowdown=max_slowdown,
            deadline_s=deadline_s,
            reference_s=self.reference_time_s,
        )
        return self.points[k]

    def slowdown(self, point: FrontierPoint) -> float:
        """`point`'s iteration time relative to all-max, minus one (negative: faster)."""
        return point.iteration_time_s / self.reference_time_s - 1

    # ------------------------------------------------------------------ files
    def _plan(self, p: FrontierPoint) -> Plan:
        compute = p.compute_energy_j if math.isfinite(p.compute_energy_j) else math.nan
        evaluation = Evaluation(
            iteration_time_s=p.iteration_time_s,
            energy_j=p.energy_j,
            compute_energy_j=compute,
            blocking_energy_j=p.energy_j - compute,
        )
        return Plan.from_frequencies(
            self.schedule,
            p.frequencies,
            p2p_power_w=self.p2p_power_w,
            evaluation=evaluation,
            emulated=self.emulated,
            switch_latency_s=self.switch_latency_s,
            hop_latency_s=self.hop_latency_s,
        )

    def write(self, out_dir: str | os.PathLike[str], *, compact: bool = False) -> Path:
        """Write ``frontier.csv``, ``plans/plan_NNNNN.json`` (one Plan file per point) and
        the all-max plan as ``all_max.json``. `compact`: every point's clocks in one
        ``plans.npz`` instead of a plan file each (`perseus.io.frontier_dir`; ~100× smaller
        on big pipelines); it needs the all-max plan, which carries the pipeline."""
        if compact:
            return self._write_compact(out_dir)
        rows = (  # built as they are written (`write_frontier_dir`)
            FrontierRow(p.iteration_time_s, p.energy_j, p.lower_bound_j, self._plan(p))
            for p in self.points
        )
        reference = self._plan(self.all_max) if self.all_max is not None else None
        return write_frontier_dir(out_dir, rows, reference)

    def _write_compact(self, out_dir: str | os.PathLike[str]) -> Path:
        if self.all_max is None:
            raise SolverError("A compact frontier directory needs the all-max plan")
        freqs = np.stack([np.concatenate(p._freqs) for p in self.points])
        plans = CompactPlans(
            frequencies=freqs,
            compute_energy=np.array([p.compute_energy_j for p in self.points]),
            stage_sizes=tuple(len(f) for f in self.all_max._freqs),
        )
        return write_compact_frontier_dir(
            out_dir,
            [p.iteration_time_s for p in self.points],
            [p.energy_j for p in self.points],
            [p.lower_bound_j for p in self.points],
            plans,
            self._plan(self.all_max),
        )

    @classmethod
    def read(cls, out_dir: str | os.PathLike[str]) -> Frontier:
        """Read a frontier written by `write` (plans are validated on load), points in
        ``index`` order whatever the file's row order (see `read_frontier_table`); a
        compact directory's clocks are read as arrays, no plan is built."""
        table = read_frontier_table(out_dir)
        compact = read_compact_plans(out_dir, table)
        if compact is not None:
            return cls._read_compact(out_dir, table, compact)
        rows = read_frontier_dir(out_dir)
        schedule = rows[0].plan.pipeline_schedule()  # the table has at least one row
        reference = read_reference_plan(out_dir)
        all_max = None
        if reference is not None:
            all_max = FrontierPoint(
                reference.iteration_time,
                reference.energy,
                math.nan,
                reference.stage_frequencies(),
            )
        points = [
            FrontierPoint(
                row.iteration_time,
                row.energy,
                row.lower_bound,
                row.plan.stage_frequencies(),
                compute_energy_j=math.nan,
            )
            for row in rows
        ]
        return cls(
            points,
            schedule=schedule,
            p2p_power_w=rows[0].plan.p2p_power,
            all_max=all_max,
            emulated=any(row.plan.emulated for row in rows),
            switch_latency_s=rows[0].plan.switch_latency,
            hop_latency_s=rows[0].plan.hop_latency,
        )

    @classmethod
    def _read_compact(
        cls, out_dir: str | os.PathLike[str], table: FrontierTable, compact: CompactPlans
    ) -> Frontier:
        reference = read_reference_plan(out_dir)
        assert reference is not None  # `read_compact_plans` checked it is there
        points = [
            FrontierPoint(
                table.iteration_time[k],
                table.energy[k],
                table.lower_bound[k],
                compact.stage_frequencies(row),
                compute_energy_j=float(compact.compute_energy[row]),
            )
            for k, row in enumerate(table.index)
        ]
        all_max = FrontierPoint(
            reference.iteration_time,
            reference.energy,
            math.nan,
            reference.stage_frequencies(),
        )
        return cls(
            points,
            schedule=reference.pipeline_schedule(),
            p2p_power_w=reference.p2p_power,
            all_max=all_max,
            emulated=reference.emulated,
            switch_latency_s=reference.switch_latency,
            hop_latency_s=reference.hop_latency,
        )


def check_frontier_memory(
    num_instructions: int, schedule_name: str, *, budget_bytes: int | None = None
) -> None:
    """Refuse a frontier that cannot fit in this machine's available memory, or in
    `budget_bytes` (the memory a solve may use, when it is bounded: the coordinator's
    solve processes, `perseus.schedulers.perseus_scheduler.solve_pool`).

    `solve_frontier` calls it first; `perseus solve` (before building the schedule) and the
    `Perseus` scheduler (at registration) call it earlier, so that a job too big to solve
    fails at once instead of after a schedule build or a profiling sweep.

    Raises:
        SolverError: ``num_instructions`` × ~100 KB is more than the available memory or
            the budget.
    """
    need = num_instructions * _BYTES_PER_INSTRUCTION
    what = f"The frontier of {num_instructions:,} instructions ({schedule_name})"
    if budget_bytes is not None and need > budget_bytes:
        raise SolverError(
            f"{what} needs about {need / 2**20:,.0f} MiB, more than the "
            f"{budget_bytes / 2**20:,.0f} MiB a solve may use"
        )
    short = memory_shortfall(need, what)
    if short:
        raise SolverError(f"{short}; solve fewer microbatches or stages")


def solve_frontier(
    profile: InstructionProfile,
    schedule: PipelineSchedule,
    *,
    p2p_power_w: float,
    progress: Callable[[float], None] | None = None,
    resolution_s: float | None = None,
    max_points: int | None = 500,
    switch_latency_s: float = 0.0,
    hop_latency_s: float = 0.0,
) -> Frontier:
    """Compute the time–energy frontier of one pipeline.

    `profile` and `schedule` become the solver's problem (`PipelineProblem`); `p2p_power_w`
    is the power a GPU draws while blocked on P2P communication or idle. `progress`,
    `resolution_s` and `max_points` are `perseus.solver.compute_frontier`'s.

    `hop_latency_s` is the time every P2P hop between two pipeline ranks takes: a lag on
    those edges of the DAG the solver optimises (LP, rounding, exact scores), so plans
    leave the slack the hops need; the all-max baseline is scored with it too.

    With `switch_latency_s` > 0 (the switching model, `perseus.planning.switching`), every
    point's unreachable clock changes are repaired, its time and energy re-scored with
    each change taking that long, and only the points still Pareto-optimal are kept.
    """
    if not (math.isfinite(switch_latency_s) and 0 <= switch_latency_s <= 10):
        raise SolverError(f"switch_latency_s must be between 0 and 10 s, got {switch_latency_s!r}")
    t0 = time.perf_counter()
    check_frontier_memory(schedule.num_instructions, schedule.name)
    try:  # the solver checks the blocking power, the hop latency and max_points itself
        problem = PipelineProblem(profile, schedule, p2p_power_w, hop_latency_s=hop_latency_s)
    except ScheduleError as exc:
        raise SolverError(str(exc)) from exc
    solution = compute_frontier(
        problem.solver, progress=progress, resolution_s=resolution_s, max_points=max_points
    )
    # Every kept plan's frequencies at once (n, points), split per stage below: one
    # gather instead of a Python list per plan (thousands of plans on big pipelines).
    freqs = problem.solver.choices_to_labels(solution.choice).astype(np.int32)
    points = [
        FrontierPoint(
            float(t_s),
            float(e_j),
            float(lb_j),
            [freqs[stage, j] for stage in problem.stage_index],
            compute_energy_j=float(c_j),
        )
        for j, (t_s, e_j, lb_j, c_j) in enumerate(
            zip(
                solution.time_s,
                solution.energy_j,
                solution.lower_bound_j,
                solution.compute_energy_j,
                strict=True,
            )
        )
    ]
    max_freqs = problem.solver.choices_to_labels(problem.solver.reference_choice())
    all_max = FrontierPoint(
        solution.reference_time_s,
        solution.reference_energy_j,
        float(solution.lp_curve.lower_bound(solution.reference_time_s)),
        [max_freqs[idx] for idx in problem.stage_index],
        compute_energy_j=solution.reference_compute_energy_j,
    )
    if switch_latency_s > 0:
        all_max = _with_switching(problem, all_max, switch_latency_s)
        # Each point repaired both ways (see `repair_frequencies`); all-max and the plans
        # that change no clock (`stage_clock_plans`) may beat every point near the fast end
        # once changes cost time.
        points = _pareto(
            [
                all_max,
                *(_with_switching(problem, p, switch_latency_s) for p in points),
                *(_with_switching(problem, p, switch_latency_s, hoist=False) for p in points),
                *_steady_points(problem, solution.lp_curve, points[-1].iteration_time_s),
            ]
        )
    stats = {**solution.stats, "wall_s": time.perf_counter() - t0}
    return Frontier(
        points,
        schedule=schedule,
        p2p_power_w=p2p_power_w,
        lp_curve=solution.lp_curve,
        stats=stats,
        all_max=all_max,
        emulated=profile.emulated,
        switch_latency_s=switch_latency_s,
        hop_latency_s=problem.hop_latency_s,
    )


def _with_switching(
    problem: PipelineProblem, p: FrontierPoint, latency_s: float, *, hoist: bool = True
) -> FrontierPoint:
    """`p` repaired and re-scored with clock changes taking `latency_s`."""
    from perseus.planning.switching import repair_frequencies

    freqs = repair_frequencies(problem, p.frequencies, latency_s, hoist=hoist)
    ev = problem.evaluate(freqs, switch_latency_s=latency_s)
    return FrontierPoint(
        ev.iteration_time_s,
        ev.energy_j,
        p.lower_bound_j,
        freqs,
        compute_energy_j=ev.compute_energy_j,
    )


def _steady_points(
    problem: PipelineProblem, lp_curve: LPCurve, max_time_s: float
) -> list[FrontierPoint]:
    """The plans of `stage_clock_plans`, scored exactly (they change no clock: the
    switching walk would give the same numbers)."""
    choice = stage_clock_plans(problem, max_time_s=max_time_s)
    if not choice.shape[1]:
        return []
    T, E, C, _ = problem.solver.account(choice)
    freqs = problem.solver.choices_to_labels(choice).astype(np.int32)
    return [
        FrontierPoint(
            float(T[j]),
            float(E[j]),
            float(lp_curve.lower_bound(float(T[j]))),
            [freqs[idx, j] for idx in problem.stage_index],
            compute_energy_j=float(C[j]),
        )
        for j in range(choice.shape[1])
    ]


def _pareto(points: list[FrontierPoint]) -> list[FrontierPoint]:
    """The points no other is both faster (or as fast) and cheaper than, fastest first."""
    kept: list[FrontierPoint] = []
    for p in sorted(points, key=lambda q: (q.iteration_time_s, q.energy_j)):
        if not kept or p.energy_j < kept[-1].energy_j:
            kept.append(p)
    return kept
