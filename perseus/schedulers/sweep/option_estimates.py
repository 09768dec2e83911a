"""The sweep's energies from what a GPU shows: a fit to the energy counter's windows.

No GPU shows an instruction's own energy. With ``estimator="windows"`` (the default, when
every rank measured its energy counter's refresh period), each round's energy windows (the
energy between two refreshes of the counter, and the seconds each instruction ran inside)
go into a least-squares fit per GPU (`perseus.schedulers.sweep.power_fit`) that gives every (stage,
kind, clock) its energy and a standard error, and the blocking power its value. The sweep
sizes its rounds to hold ``round_ticks`` refreshes, and after its passes measures again
the options whose relative standard error is above ``target_uncertainty`` and that are not
clearly dominated (CONFIRM: at most ``max_repeats`` times each, in at most a quarter as many
rounds as came before). A unit whose fitted power no GPU can draw (at or below the idle power its
rank reported: `perseus.schedulers.sweep.power_fit.GPUBounds`; the limit bounds the fit itself) counts as unknown
(infinite standard error, so CONFIRM measures it again), and if it still is at the end it
never reaches the solver: below the max clock its row is left out; at the max clock, which
every plan needs, all-max stays (`unphysical_at_max`). Both are logged and listed in
``profiling.json`` (``left_out``). ``estimator="breakdown"`` takes each instruction's reported energy
as it is (a real GPU's breakdown is its iteration's mean power times the instruction's
time): it remains for ranks that report no windows.
"""

from __future__ import annotations

import logging
import math
import statistics
from typing import Any

from perseus.domain.kinds import MIN_PLAUSIBLE_POWER_W
from perseus.domain.rows import ProfileRow
from perseus.schedulers.args import SweepArgs
from perseus.schedulers.measurement import RoundMeasurement
from perseus.schedulers.pipeline import PipelineScheduler
from perseus.schedulers.sweep.power_fit import GPUBounds, PowerRegression

__all__ = ["SweepEstimates"]

logger = logging.getLogger(__name__)


class SweepEstimates:
    """Every option's energy as the sweep knows it: fitted to the windows, or the breakdown.

    Args:
        scheduler: The pipeline scheduler whose job is profiled (its ranks and stages).
        args: The sweep's arguments (`estimator`).
    """

    def __init__(self, scheduler: PipelineScheduler, args: SweepArgs) -> None:
        self._scheduler = scheduler
        refresh = [r.energy_refresh_s for r in scheduler.rank_infos]
        self.windows = args.estimator == "windows" and all(r is not None for r in refresh)
        """Energies are fitted to the ranks' energy windows (`perseus.schedulers.sweep.power_fit`)."""
        self.refresh_s = max((r for r in refresh if r is not None), default=0.0)
        """The slowest energy counter's refresh period (0: continuous)."""
        self.regression = PowerRegression(
            {r.rank: GPUBounds(r.idle_power_w, r.power_limit_w) for r in scheduler.rank_infos}
        )
        self.left_out: list[dict[str, Any]] = []
        """Rows `annotate` left out last, each with its reason (``profiling.json``)."""
        self.energy_se: dict[tuple[int, str], dict[int, float]] = {}
        """'windows': each option's standard error, J."""
        if args.estimator == "windows" and not self.windows:
            logger.warning(
                "Job %s: rank(s) %s did not measure an energy counter's refresh period (no "
                "counter, or an older client): each instruction's energy is taken as the "
                "ranks report it",
                scheduler.job_info.job_id,
                [r.rank for r in scheduler.rank_infos if r.energy_refresh_s is None],
            )

    def absorb(self, m: RoundMeasurement) -> None:
        """Take a round's energy windows and instruction times into the fit."""
        if not self.windows:
            return
        for rank, rows in m.windows.items():
            self.regression.add(rank, rows)
        for rank, times in m.unit_time.items():
            for unit, (total_s, count) in times.items():
                self.regression.add_time(rank, unit, total_s, count)

    def energy(self, stage: int, name: str, freq: int, breakdown_j: float) -> float:
        """The energy of one instruction of (stage, name) at `freq` as known now: fitted to
        the windows so far ('windows'), else the ranks' breakdown."""
        if not self.windows:
            return breakdown_j
        estimate = self.estimate(stage, name, freq)
        return breakdown_j if estimate is None else estimate[0]

    def estimate(
        self, stage: int, name: str, freq: int, time_s: float | None = None
    ) -> tuple[float, float] | None:
        """(energy J, standard error J) of (stage, name) at `freq`: the sum over the
        stage's tensor-parallel GPUs of the first data-parallel pipeline. `time_s`: the
        option's time as the profile states it, which each GPU's fitted power multiplies
        (default: the mean of the times its windows saw)."""
        pp = self._scheduler.pipeline.stage_ranks[stage]
        members = self._scheduler.stage_ranks[pp]
        first_dp = min(r.dp_rank for r in members)
        total = var = 0.0
        for info in members:
            if info.dp_rank != first_dp:
                continue
            est = self.regression.unit_energy(info.rank, (stage, name, freq), time_s)
            if est is None:
                return None
            if self.unphysical(stage, name, freq) is not None:
                est = (est[0], math.inf)
            total += est[0]
            var += est[1] ** 2
        return total, math.sqrt(var)

    def unphysical(self, stage: int, name: str, freq: int) -> str | None:
        """Why the fitted power of (stage, name) at `freq` is one no GPU of the stage can
        draw (None: it can)."""
        pp = self._scheduler.pipeline.stage_ranks[stage]
        fits = self.regression.fit()
        for info in self._scheduler.stage_ranks[pp]:
            fit = fits.get(info.rank)
            why = None if fit is None else fit.unphysical.get((stage, name, freq))
            if why is not None:
                return f"rank {info.rank}: {why}"
        return None

    def unphysical_at_max(self) -> list[str]:
        """The max-clock options whose fitted power no GPU can draw, described: every plan
        needs them, so all-max stays while there is one."""
        return [
            f"stage {e['stage']} {e['instruction']} at {e['frequency']} MHz ({e['reason']})"
            for e in self.left_out
            if e.get("max_clock")
        ]

    def refit(
        self,
        energy_j: dict[tuple[int, str], dict[int, float]],
        time_s: dict[tuple[int, str], dict[int, float]] | None = None,
    ) -> None:
        """Every measured option's energy (in `energy_j`, updated) and standard error from
        the fit of all windows: the fitted power times the option's time in `time_s` (the
        profile's row), so that a row's power is the fitted one, within the GPU's bounds
        (the mean of the windows' times can differ from the row's: a few instructions
        stretched while a clock change landed lengthen it)."""
        if not self.windows:
            return
        for unit, energies in energy_j.items():
            stage, name = unit
            se = self.energy_se.setdefault(unit, {})
            times = (time_s or {}).get(unit, {})
            for freq in energies:
                estimate = self.estimate(stage, name, freq, times.get(freq))
                if estimate is not None:
                    energies[freq], se[freq] = estimate
                else:
                    se[freq] = math.inf

    def after_work_shares(self) -> dict[int, list[float]]:
        """'windows': per pipeline rank, the fitted share of an instruction's power above
        blocking its GPUs still draw in each band after work stops (`GPUFit.decay`; the mean
        over the GPUs of the first data-parallel pipeline), for the plans' predicted
        savings (`perseus.planning.after_work`). Empty without a fit."""
        if not self.windows:
            return {}
        fits = self.regression.fit()
        first_dp = min((r.dp_rank for r in self._scheduler.rank_infos), default=0)
        per_rank: dict[int, list[list[float]]] = {}
        for info in self._scheduler.rank_infos:
            fit = fits.get(info.rank)
            if info.dp_rank != first_dp or fit is None or not fit.decay:
                continue
            per_rank.setdefault(info.pp_rank, []).append(fit.decay)
        return {
            pp: [statistics.fmean(band) for band in zip(*shares, strict=False)]
            for pp, shares in sorted(per_rank.items())
        }

    def block_power_w(self) -> float | None:
        """'windows': the median over GPUs of the fitted blocking power (None: no fit)."""
        fits = self.regression.fit()
        values = [f.block.power_w for f in fits.values() if math.isfinite(f.block.se_w)]
        return statistics.median(values) if values else None

    def annotate(self, rows: list[ProfileRow]) -> list[ProfileRow]:
        """'windows': `rows` marked as estimated, with their standard error. An option whose
        energy the windows could not tell (a power below `MIN_PLAUSIBLE_POWER_W`, or a fit
        that found no finite standard error: no window it used separates the row) or whose fitted power no GPU can
        draw (`unphysical`) is left out below the max clock: the plan does without the clock
        rather than trust it. At the max clock it stays in the rows
        and `unphysical_at_max` says so (all-max stays)."""
        if not self.windows:
            return rows
        top = {(r.stage, r.instruction): r.frequency for r in rows}
        for r in rows:
            top[r.stage, r.instruction] = max(top[r.stage, r.instruction], r.frequency)
        out = []
        left_out: list[dict[str, Any]] = []
        for r in rows:
            why = self.unphysical(r.stage, r.instruction, r.frequency)
            if why is None and (r.energy <= 0 or r.energy < MIN_PLAUSIBLE_POWER_W * r.time):
                why = "its energy could not be estimated from the counter's refreshes"
            se = self.energy_se.get((r.stage, r.instruction), {}).get(r.frequency)
            at_max = r.frequency >= top[r.stage, r.instruction]
            if why is None and not at_max and se is not None and not math.isfinite(se):
                why = (
                    "no energy window told its power apart (its clock ran only in rounds "
                    "whose windows were left out, or always beside another row in one "
                    "proportion)"
                )
            if why is not None:
                left_out.append(
                    {
                        "stage": r.stage,
                        "instruction": r.instruction,
                        "frequency": r.frequency,
                        "reason": why,
                        "max_clock": at_max,
                    }
                )
                if not at_max:
                    continue
            out.append(r._replace(estimated=True, energy_se=math.inf if se is None else se))
        if left_out and left_out != self.left_out:
            logger.warning(
                "Job %s: %d profile row(s) a GPU cannot produce (left out below the max clock): %s",
                self._scheduler.job_info.job_id,
                len(left_out),
                "; ".join(
                    f"stage {e['stage']} {e['instruction']} at {e['frequency']} MHz: {e['reason']}"
                    for e in left_out[:5]
                )
                + (f" and {len(left_out) - 5} more" if len(left_out) > 5 else ""),
            )
        self.left_out = left_out
        return out

    def report(self, energy_j: dict[tuple[int, str], dict[int, float]]) -> dict[str, Any]:
        """'windows': the fit's figures for ``profiling.json`` (nothing without windows)."""
        if not self.windows:
            return {}
        fits = self.regression.fit()
        blocks = [f.block for f in fits.values()]
        rel = sorted(
            se / abs(energy_j[unit][f]) if energy_j[unit][f] else math.inf
            for unit, ses in self.energy_se.items()
            for f, se in ses.items()
        )
        return {
            "sampling": self.regression.model(),
            "windows": sum(f.windows for f in fits.values()),
            "blocking_power_w": self.block_power_w(),
            "blocking_power_se_w": (statistics.median(b.se_w for b in blocks) if blocks else None),
            "options": len(rel),
            "energy_se_median": statistics.median(rel) if rel else None,
            "energy_se_max": rel[-1] if rel else None,
            "left_out": self.left_out,
            "after_work_shares": {str(pp): s for pp, s in self.after_work_shares().items()},
        }
