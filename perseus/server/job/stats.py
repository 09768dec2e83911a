"""What the operator's view (``/jobs``, ``/metrics``) knows of one job, kept up to date by
the job itself (`perseus.server.job`) as rounds are handed out and results arrive.

Everything here runs on the event loop and is O(1) per result (O(iterations) for its
energy total); classifying a round's schedules (`perseus.planning.report.round_kind`,
O(instructions)) runs in the round's worker thread.

Cumulative totals (Prometheus counters, `perseus.server.metrics`): the energy every GPU of
the job measured over every reported iteration; against the job's latest measured all-max
round, per iteration, what each later complete round saved (``energy_saved_j_total``) or
spent above it (``energy_overspent_j_total``: profiling rounds, a plan that costs more);
the net saving is their difference. Both count from the first all-max round on.
"""

from __future__ import annotations

import math
import re
from typing import Any

from perseus.domain.plan import Plan
from perseus.planning.report import (
    REPORT_WINDOW,
    EnergyReport,
    IterationFigures,
    IterationMeter,
    RoundKind,
    median_of_rounds,
    predicted_figures,
)
from perseus.protocol import ProfilingResult

__all__ = ["MAX_GUARD_REASONS", "JobStats", "MeasuredRound"]

MAX_GUARD_REASONS = 16
"""Distinct guard-move reasons counted per job; more are counted as ``other`` (each reason is
a label value of a Prometheus series)."""
_REASON = re.compile(r"[^a-z0-9_]+")


class MeasuredRound:
    """The figures of one round whose every rank reported."""

    __slots__ = ("figures", "kind", "number")

    def __init__(self, number: int, kind: RoundKind, figures: IterationFigures) -> None:
        self.number = number
        self.kind = kind
        self.figures = figures


MAX_KEPT = REPORT_WINDOW + 1
"""Measured rounds of each kind kept for the report's medians (round 0 is never one)."""


class JobStats:
    """Rounds, round latency, measured and predicted figures of one job."""

    def __init__(self, world_size: int, dp_degree: int) -> None:
        self.world_size = world_size
        """Results that make a round complete: the job's talking ranks (its leaders under
        protocol 2, each result speaking for its group; every rank under protocol 1)."""
        self.dp_degree = dp_degree
        self.rounds_completed = 0
        """Rounds whose schedules were handed out."""
        self.last_round_latency_s: float | None = None
        self.plan: Plan | None = None
        """The deployed plan at the last round."""
        self.baseline_plan: Plan | None = None
        """The all-max plan scored on the same profile (the predicted baseline)."""
        self.latest: MeasuredRound | None = None
        self.by_kind: dict[RoundKind, MeasuredRound] = {}
        """The latest complete round of each kind."""
        self.measured: list[MeasuredRound] = []
        """Every measured all-max round, and every round of the plan deployed now (the
        report's medians; at most `MAX_KEPT` of each, the newest)."""
        self.promise: list[dict[str, Any]] = []
        """The scheduler's deployments, guard checks and moves (newest last, at most 100)."""
        self._kinds: dict[int, RoundKind] = {}
        self._meter_round: int | None = None
        self._meter = IterationMeter()
        self._meter_iterations = 0
        self.rounds_measured = 0
        """Rounds whose every rank reported."""
        self.iterations_measured = 0
        """Iterations of the measured rounds."""
        self.energy_j_total = 0.0
        """Energy every GPU of the job measured, over every reported iteration, J."""
        self.energy_saved_j_total = 0.0
        """Σ over complete rounds after the first all-max one of iterations × max(0,
        E(all-max) − E(round)) per iteration, J."""
        self.energy_overspent_j_total = 0.0
        """The same with max(0, E(round) − E(all-max)), J."""
        self.guard_moves: dict[str, int] = {}
        """Moves of the closed loop's guard, by reason (`guard_moved`)."""
        self._solve_failures: list[str] = []
        """Kinds of the scheduler's failed frontier solves the metrics have not counted yet
        (`take_solve_failures`)."""

    def round_issued(
        self,
        number: int,
        kind: RoundKind,
        *,
        plan: Plan | None,
        baseline_plan: Plan | None,
        latency_s: float,
    ) -> None:
        """Round `number`'s schedules (of `kind`) were handed out, `latency_s` after its
        last rank asked."""
        self.rounds_completed += 1
        self.last_round_latency_s = latency_s
        if plan is not None and (self.plan is None or plan.frequencies != self.plan.frequencies):
            # Another plan: the previous one's rounds no longer describe what runs.
            self.measured = [m for m in self.measured if m.kind is not RoundKind.DEPLOYED]
        self.plan = plan
        if baseline_plan is not None:
            self.baseline_plan = baseline_plan
        # Only the round whose results come next can still be measured.
        self._kinds = {number: kind}

    @property
    def plan_is_all_max(self) -> bool:
        """The deployed plan runs every instruction at its top clock (the baseline's clocks)."""
        if self.plan is None or self.baseline_plan is None:
            return False
        return self.plan.frequencies == self.baseline_plan.frequencies

    def promise_events(self, events: list[dict[str, Any]]) -> None:
        """The scheduler's latest deployments, checks and moves."""
        self.promise.extend(events)
        del self.promise[:-100]
        for event in events:
            if event.get("event") == "move":
                self.guard_moved("faster")
            elif event.get("event") == "fallback":
                self.guard_moved("all_max")
            elif event.get("event") == "redeploy":
                self.guard_moved("redeploy")
            elif event.get("event") == "solve_failed":
                self._solve_failures.append(str(event.get("failure") or "error"))

    def take_solve_failures(self) -> list[str]:
        """The kinds of the frontier solves that failed since the last call
        (``perseus_solve_failures_total``, counted once per round)."""
        kinds, self._solve_failures = self._solve_failures, []
        return kinds

    def add(self, number: int, result: ProfilingResult) -> None:
        """One rank's result for round `number`; the round is measured when all ranks are in."""
        if self._meter_round != number:
            self._meter_round = number
            self._meter = IterationMeter()
            self._meter_iterations = 0
        self._meter.add(result)
        self._meter_iterations = max(self._meter_iterations, len(result.iter_time))
        energy = math.fsum(result.iter_energy)
        if math.isfinite(energy):
            self.energy_j_total += energy
        if self._meter.ranks < self.world_size:
            return
        figures = self._meter.figures()
        kind = self._kinds.get(number, RoundKind.OTHER)
        iterations = self._meter_iterations
        self._meter_round, self._meter = None, IterationMeter()
        if figures is None:
            return
        measured = MeasuredRound(number, kind, figures)
        self.latest = measured
        self.by_kind[kind] = measured
        self._keep(measured)
        self.rounds_measured += 1
        self.iterations_measured += iterations
        baseline = self.by_kind.get(RoundKind.ALL_MAX)
        if baseline is not None:
            delta = iterations * (baseline.figures.energy_j - figures.energy_j)
            if delta >= 0:
                self.energy_saved_j_total += delta
            else:
                self.energy_overspent_j_total -= delta

    def restore(self, number: int, kind: RoundKind, figures: IterationFigures) -> None:
        """A round measured before a coordinator restart (read back from the dump)."""
        measured = MeasuredRound(number, kind, figures)
        current = self.by_kind.get(kind)
        if current is None or current.number < number:
            self.by_kind[kind] = measured
        if self.latest is None or self.latest.number < number:
            self.latest = measured
        self._keep(measured)

    def _keep(self, measured: MeasuredRound) -> None:
        """Keep a round for the report's medians (see `measured`)."""
        if measured.kind is RoundKind.OTHER:
            return
        self.measured.append(measured)
        same = [m for m in self.measured if m.kind is measured.kind]
        if len(same) > MAX_KEPT:
            self.measured.remove(same[0])

    def guard_moved(self, reason: str) -> None:
        """Count one move of the closed loop's guard (``perseus_guard_moves_total``).

        `reason` is a short word (e.g. ``"slowdown"``, ``"energy"``, ``"all_max"``): made
        lower case, anything but letters, digits and ``_`` becomes ``_``, cut to 40
        characters; beyond `MAX_GUARD_REASONS` distinct reasons it counts as ``other``.
        """
        label = _REASON.sub("_", reason.lower()).strip("_")[:40] or "unknown"
        if label not in self.guard_moves and len(self.guard_moves) >= MAX_GUARD_REASONS:
            label = "other"
        self.guard_moves[label] = self.guard_moves.get(label, 0) + 1

    def report(self) -> EnergyReport:
        """Measured (medians, `median_of_rounds`) and predicted figures."""
        all_max, deployed = median_of_rounds(
            [(m.number, m.kind, m.figures) for m in self.measured],
            plan_is_all_max=self.plan is not None and self.plan_is_all_max,
        )
        return EnergyReport.of(
            measured_all_max=all_max,
            measured_deployed=deployed,
            predicted_all_max=(
                predicted_figures(self.baseline_plan, self.dp_degree)
                if self.baseline_plan is not None
                else None
            ),
            predicted_deployed=(
                predicted_figures(self.plan, self.dp_degree) if self.plan is not None else None
            ),
        )
