"""The sweep's follow-up passes, REFINE and CONFIRM: the levels still worth measuring.

REFINE (after the coarse pass) measures, per instruction, only skipped levels next to the
points that shape its time–energy hull, by bisection
(`perseus.schedulers.sweep.levels.refine_levels`): around the fastest and the cheapest option, and
around vertices where the hull bends enough that a skipped level could lie more than
``refine_tolerance`` below the line between its measured neighbours. Where the hull is
straight, skipped levels would give the solver nothing new. Each REFINE round runs every
instruction at its own next level (the others at max), so REFINE takes as many rounds as
the instruction with the most levels to measure. CONFIRM ('windows' estimates) measures
again the options whose energy is uncertain enough to change the plan: every kind of a
stage runs the highest of its kinds' next pending levels (one clock a stage per round).
`InstructionSweep` owns one `FollowUp` and moves its phase by what the passes answer.
"""

from __future__ import annotations

import logging
import math

from perseus.schedulers.args import SweepArgs
from perseus.schedulers.measurement import RoundMeasurement, measured_unit_time
from perseus.schedulers.sweep.levels import refine_levels
from perseus.schedulers.sweep.option_estimates import SweepEstimates
from perseus.schedulers.sweep.row_times import note_landing

__all__ = ["FollowUp", "uncertain_options"]

logger = logging.getLogger(__name__)

Unit = tuple[int, str]
Options = dict[Unit, dict[int, float]]
"""Per (pipeline stage, kind), per clock (MHz), a time (s) or an energy (J)."""


def uncertain_options(
    times: dict[int, float],
    energies: dict[int, float],
    ses: dict[int, float],
    repeats: dict[int, int],
    *,
    block_w: float,
    target: float,
    max_repeats: int,
) -> list[int]:
    """One instruction's options, descending, worth another measurement: relative standard
    error above `target`, fewer than `max_repeats` repeats, and not clearly dominated (an
    option at least as fast costs less by more than both uncertainties) in the energy the
    plan counts (the instruction's, less the blocking power its time saves)."""
    cost = {f: energies[f] - block_w * times[f] for f in energies}
    out = []
    for f in sorted(energies, reverse=True):
        se = ses.get(f, math.inf)
        if repeats.get(f, 0) >= max_repeats:
            continue
        if se <= target * abs(energies[f]):
            continue
        dominated = any(
            times[g] <= times[f] and cost[g] + 2 * ses.get(g, math.inf) < cost[f] - 2 * se
            for g in energies
            if g != f
        )
        if not dominated:
            out.append(f)
    return out


class FollowUp:
    """The levels REFINE and CONFIRM still have to measure, per (stage, kind).

    Args:
        args: The sweep's arguments (`refine_tolerance`, `target_uncertainty`,
            `max_repeats`).
        levels: Every level the sweep may run, descending.
        units: Every (pipeline stage, kind) the schedule runs.
        estimates: The sweep's energies (refitted before CONFIRM picks its options).
        job_id: For the log.
        landing_only: The sweep's (stage, kind, MHz) whose time holds no instruction that
            ran clear of a clock change (kept up to date here for the follow-up rounds: a
            time of the clock's own replaces such a time, and is never averaged with one).
    """

    def __init__(
        self,
        args: SweepArgs,
        levels: list[int],
        units: list[Unit],
        estimates: SweepEstimates,
        job_id: str,
        *,
        landing_only: set[tuple[int, str, int]] | None = None,
    ) -> None:
        self.landing_only = set() if landing_only is None else landing_only
        self.levels = levels
        self.units = units
        self.estimates = estimates
        self.job_id = job_id
        self.refine_tolerance = args.refine_tolerance
        self.target_uncertainty = args.target_uncertainty
        self.max_repeats = args.max_repeats
        self.pending: dict[Unit, list[int]] = {}
        """Per (stage, kind), the levels still to measure, descending."""
        self.repeats: dict[tuple[int, str, int], int] = {}
        """CONFIRM: how often each (stage, kind, level) was measured again."""
        self.confirm_rounds_left = 0

    # ------------------------------------------------------------------ REFINE
    def rounds_left(self) -> int:
        """About how many REFINE rounds are left."""
        return max((len(v) for v in self.pending.values()), default=0) + 1

    def refine_level(self, stage: int, name: str) -> int | None:
        """REFINE: the level (stage, name) runs this round (None: nothing pending)."""
        left = self.pending.get((stage, name))
        return left[0] if left else None

    def _refine_next(self, unit: Unit, time_s: Options, energy_j: Options) -> list[int]:
        energy = energy_j.get(unit, {})
        points = {f: (t, energy[f]) for f, t in time_s.get(unit, {}).items()}
        return refine_levels(points, self.levels, self.refine_tolerance)

    def start_refine(self, time_s: Options, energy_j: Options) -> bool:
        """After the coarse pass: whether any instruction has levels worth refining."""
        for unit in self.units:
            levels = self._refine_next(unit, time_s, energy_j)
            if levels:
                self.pending[unit] = levels
        return bool(self.pending)

    def record_refine(self, m: RoundMeasurement, time_s: Options, energy_j: Options) -> bool:
        """A REFINE round into `time_s` / `energy_j`; whether REFINE is over."""
        for unit, left in list(self.pending.items()):
            stage, name = unit
            freq = left.pop(0)
            vs = m.virtual_stages[stage]
            t, own = measured_unit_time(m, stage, name, freq, vs.time_s[name])
            time_s[unit][freq] = t
            note_landing(self.landing_only, (stage, name, freq), own)
            energy_j[unit][freq] = self.estimates.energy(stage, name, freq, vs.energy_j[name])
            if not left:
                more = self._refine_next(unit, time_s, energy_j)
                if more:
                    self.pending[unit] = more
                else:
                    del self.pending[unit]
        return not self.pending

    # ------------------------------------------------------------------ CONFIRM
    def confirm_level(self, stage: int) -> int | None:
        """CONFIRM: the clock every kind of `stage` runs this round, the highest of its
        kinds' next pending ones (one clock a stage: no clock changes within the round,
        which would charge an instruction part of its predecessor's clock)."""
        firsts = [left[0] for (s, _), left in self.pending.items() if s == stage and left]
        return max(firsts) if firsts else None

    def start_confirm(self, time_s: Options, energy_j: Options, rounds_so_far: int) -> bool:
        """'windows': whether some options' uncertainty could change the plan (they are
        then pending)."""
        if not self.estimates.windows or self.target_uncertainty <= 0 or self.max_repeats <= 0:
            return False
        if self.confirm_rounds_left <= 0 and not self.repeats:
            # At most a quarter as many extra rounds as the profile took so far (half made a
            # user's job spend 25 more rounds, a minute, before any plan ran).
            self.confirm_rounds_left = max(1, rounds_so_far // 4)
        if self.confirm_rounds_left <= 0:
            return False
        self.estimates.refit(energy_j, time_s)
        block_w = self.estimates.block_power_w() or 0.0
        for unit in self.units:
            freqs = uncertain_options(
                time_s.get(unit, {}),
                energy_j.get(unit, {}),
                self.estimates.energy_se.get(unit, {}),
                {f: n for (s, k, f), n in self.repeats.items() if (s, k) == unit},
                block_w=block_w,
                target=self.target_uncertainty,
                max_repeats=self.max_repeats,
            )
            if freqs:
                self.pending[unit] = freqs
        if self.pending:
            logger.info(
                "Job %s: measuring %d option(s) again whose energy is uncertain by more than "
                "%.1f %% and could change the plan",
                self.job_id,
                sum(len(v) for v in self.pending.values()),
                100 * self.target_uncertainty,
            )
        return bool(self.pending)

    def record_confirm(self, m: RoundMeasurement, time_s: Options, energy_j: Options) -> bool:
        """A CONFIRM round: every kind of a stage with options pending ran at its
        `confirm_level`; each kind's time there is averaged over its rounds (and its
        energy refitted), and the level leaves the pending lists that held it. Whether
        CONFIRM is over."""
        levels = {stage: self.confirm_level(stage) for stage, _ in self.pending}
        for unit in self.units:
            stage, name = unit
            level = levels.get(stage)
            if level is None:
                continue
            vs = m.virtual_stages[stage]
            n = self.repeats.get((stage, name, level), 0)
            times = time_s.setdefault(unit, {})
            t, own = measured_unit_time(m, stage, name, level, vs.time_s[name])
            key = (stage, name, level)
            had_own = level in times and key not in self.landing_only
            if own and not had_own:  # the first time of the clock's own replaces the other
                times[level] = t
            elif own or not had_own:
                times[level] = (times.get(level, t) * n + t) / (n + 1)
            if own or not had_own:  # a landing-only time never joins one of the clock's own
                note_landing(self.landing_only, key, own)
            self.repeats[stage, name, level] = n + 1
            energy_j.setdefault(unit, {})[level] = self.estimates.energy(
                stage, name, level, vs.energy_j[name]
            )
            left = self.pending.get(unit)
            if left and left[0] == level:
                left.pop(0)
                if not left:
                    del self.pending[unit]
        self.confirm_rounds_left -= 1
        if self.confirm_rounds_left <= 0:
            self.pending.clear()
        return not self.pending
