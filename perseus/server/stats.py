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

from perseus.domain.plan import Plan
from perseus.planning.report import (
    EnergyReport,
    IterationFigures,
    IterationMeter,
    RoundKind,
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


class JobStats:
    """Rounds, round latency, measured and predicted figures of one job."""

    def __init__(self, world_size: int, dp_degree: int) -> None:
        self.world_size = world_size
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
        self.plan = plan
        if baseline_plan is not None:
            self.baseline_plan = baseline_plan
        # Only the round whose results come next can still be measured.
        self._kinds = {number: kind}

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
        """Measured (latest all-max and deployed rounds) and predicted figures."""
        all_max = self.by_kind.get(RoundKind.ALL_MAX)
        deployed = self.by_kind.get(RoundKind.DEPLOYED)
        return EnergyReport.of(
            measured_all_max=all_max.figures if all_max else None,
            measured_deployed=deployed.figures if deployed else None,
            predicted_all_max=(
                predicted_figures(self.baseline_plan, self.dp_degree)
                if self.baseline_plan is not None
                else None
            ),
            predicted_deployed=(
                predicted_figures(self.plan, self.dp_degree) if self.plan is not None else None
            ),
        )
