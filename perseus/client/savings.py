"""What a rank deploys and what it saves, for the hook's DEBUG log lines.

The job's own figures (every GPU, measured against the job's all-max rounds, beside the
plan's prediction) come from the coordinator and rank 0 logs them at INFO
(`perseus.protocol.RoundStatus`); these per-GPU lines are for debugging one rank.

A schedule the coordinator hands out for a second round in a row is *deployed* (a sweep
changes it every round): logged once, with its frequency range. Rounds that ran every
instruction at the GPU's highest clock are the *all-max baseline*; after a deployed
schedule's first measured round, and when the hook closes, the rank logs its energy and
time per iteration against that baseline (this rank's GPU; the job's view is the
coordinator's ``GET /jobs/{job_id}`` and ``perseus report``).
"""

from __future__ import annotations

import logging
import math

__all__ = ["SavingsLog"]


def _mean(values: list[float]) -> float | None:
    good = [v for v in values if math.isfinite(v)]
    return math.fsum(good) / len(good) if good else None


class SavingsLog:
    """Per-rank bookkeeping for the deploy and saving log lines (O(instructions) a round)."""

    def __init__(self, rank: int, max_freq_mhz: int, logger: logging.Logger) -> None:
        self.rank = rank
        self.max_freq_mhz = max_freq_mhz
        self.logger = logger
        self._freqs: list[int] | None = None
        self._round = -1
        self._since = -1
        self._announced = False
        self._reported = False
        self.baseline: tuple[float, float] | None = None
        """(time s, energy J) per iteration of the latest all-max round."""
        self.deployed: tuple[float, float] | None = None
        """(time s, energy J) per iteration of the latest round of a deployed schedule."""

    @property
    def _all_max(self) -> bool:
        return self._freqs is not None and all(f == self.max_freq_mhz for f in self._freqs)

    def schedule(self, round_number: int, frequencies: list[int]) -> None:
        """The schedule of round `round_number` (called as each round starts)."""
        self._round = round_number
        if frequencies != self._freqs:
            self._freqs = list(frequencies)
            self._since = round_number
            self._announced = self._reported = False
            return
        if self._announced or not frequencies:
            return
        self._announced = True
        what = (
            "every instruction at the max clock"
            if self._all_max
            else f"{min(frequencies)}–{max(frequencies)} MHz "
            f"(mean {sum(frequencies) / len(frequencies):.0f})"
        )
        self.logger.debug(
            "Rank %d: deployed since round %d: %d instructions, %s",
            self.rank,
            self._since,
            len(frequencies),
            what,
        )

    def measured(self, iter_time: list[float], iter_energy: list[float]) -> None:
        """The round's iterations were measured."""
        t, e = _mean(iter_time), _mean(iter_energy)
        if t is None or e is None:
            return
        if self._all_max:
            self.baseline = (t, e)
        elif self._announced:
            self.deployed = (t, e)
            if not self._reported and self.baseline is not None:
                self._reported = True
                self.log_saving()

    def log_saving(self) -> None:
        """Log the deployed schedule's energy and time against all-max, when both are known."""
        if self.baseline is None or self.deployed is None or self.baseline[1] <= 0:
            return
        (t0, e0), (t1, e1) = self.baseline, self.deployed
        self.logger.debug(
            "Rank %d: saves %.1f %% energy per iteration against all-max (%.3f J vs %.3f J); "
            "iteration time %+.1f %% (%.4f s vs %.4f s)",
            self.rank,
            100 * (1 - e1 / e0),
            e1,
            e0,
            100 * (t1 / t0 - 1) if t0 > 0 else 0.0,
            t1,
            t0,
        )
