"""A rank's energy readings: the GPU's energy counter, read cheaply, and a round's windows.

`EnergyReader` is what the hook's timings read energy through (`perseus.client.gpu.timing`).
On a GPU with an energy counter, a `CounterPoller` (`perseus.client.gpu.sensing`) watches the
counter's refreshes off the training thread: a reading is the poller's last value (the
counter only moves at its refreshes, so this is the counter's now, without another read
— 2.4 ms on an H100 — on the training thread), and at a round's end the round is cut at
the refreshes into energy windows, and its steps get the round's mean power between its
first and last refresh (`RoundRecord.spread`). Without a counter, energy is power × time.

At start, while nothing runs yet, the refreshes the watcher saw measuring the period also
give the GPU's idle power (`EnergyReader.idle_power_w`): the energy between the first and
the last of them over the time between them, when it held steady.
"""

from __future__ import annotations

import logging
import math
import time

from perseus.client.gpu.rounds import RoundRecord
from perseus.client.gpu.sensing import CounterPoller, energy_windows, mean_power_w
from perseus.protocol import MAX_POWER_W, EnergyWindow
from zeus_power.device.base import GPU

__all__ = ["EnergyReader"]

logger = logging.getLogger(__name__)

IDLE_MIN_SPAN_S = 0.1
"""The least time the start-up refreshes must span for an idle power (a continuous
counter's few first reads span milliseconds: the watcher's next reads, up to
`IDLE_MAX_WAIT_S` more, fill it)."""
IDLE_MAX_WAIT_S = 0.3
"""The most the idle measurement may add to start-up."""
IDLE_STEADY = 0.1
"""Each window between the start-up refreshes must draw within this share of their mean
power, or the GPU was not idle (work ending, a power still decaying): no idle power."""


class EnergyReader:
    """Energy readings of one rank's GPU (see the module docstring).

    Starts the counter's watcher (when the GPU has a counter) and waits for it to measure
    the refresh period (`refresh_s`: 0.0 continuous, None unknown or no counter), and
    from the same refreshes the GPU's idle power (`idle_power_w`, W; None: not measured).
    Make it while the GPU is idle (the hook does, at registration).
    """

    def __init__(self, gpu: GPU, *, rank: int) -> None:
        self._gpu = gpu
        self._rank = rank
        self.has_counter = gpu.supports_energy_counter()
        self._poller: CounterPoller | None = None
        self.refresh_s: float | None = None
        self.idle_power_w: float | None = None
        """The GPU's power at start, while idle, W (module docstring); None: not measured."""
        if self.has_counter:
            # The counter's refresh period, measured here (a few hundred ms): the
            # coordinator sizes profiling rounds from it.
            self._poller = CounterPoller(gpu.total_energy_mj, name=f"perseus-counter-rank{rank}")
            self.refresh_s = self._poller.wait_period()
            logger.info(
                "Rank %d: the energy counter refreshes %s",
                rank,
                "continuously"
                if self.refresh_s == 0.0
                else "at an unknown period"
                if self.refresh_s is None
                else f"every {self.refresh_s * 1000:.1f} ms",
            )
            self.idle_power_w = self._measure_idle_w()

    def _measure_idle_w(self) -> float | None:
        """The GPU's power from the refreshes seen since the watcher started (see
        `IDLE_MIN_SPAN_S`, `IDLE_STEADY`); None without two steady refreshes to go by."""
        poller = self._poller
        if poller is None or poller.error is not None:
            return None
        ticks = poller.ticks(-math.inf, math.inf)
        span_s = ticks[-1].time_s - ticks[0].time_s if ticks else 0.0
        if ticks and span_s < IDLE_MIN_SPAN_S and poller.period_s == 0.0:
            # A continuous counter: its first reads are milliseconds apart, and the watcher
            # reads it every few tens of ms from now on (no extra reads of ours).
            time.sleep(min(IDLE_MIN_SPAN_S - span_s, IDLE_MAX_WAIT_S))
            ticks = poller.ticks(-math.inf, math.inf)
        if len(ticks) < 2 or poller.error is not None:
            return None
        windows = energy_windows(ticks, [], 0, start_s=ticks[0].time_s, end_s=ticks[-1].time_s)
        time_s = sum(w.time_s for w in windows)
        if not windows or time_s <= 0.0:
            return None
        power_w = sum(w.energy_j for w in windows) / time_s
        powers = [w.energy_j / w.time_s for w in windows]
        if any(abs(p - power_w) > IDLE_STEADY * power_w for p in powers):
            logger.info(
                "Rank %d: the GPU's power did not hold steady at start (%.1f .. %.1f W over "
                "%d refreshes): was it busy? Its idle power is not reported",
                self._rank,
                min(powers),
                max(powers),
                len(windows) + 1,
            )
            return None
        if not (math.isfinite(power_w) and 0.0 <= power_w <= MAX_POWER_W):
            return None
        return power_w

    def read_mj(self) -> float:
        """The counter now, in millijoules (0.0 without a counter)."""
        if not self.has_counter:
            return 0.0
        poller = self._poller
        if poller is not None and poller.period_s and poller.error is None:
            latest = poller.latest_mj()
            if latest is not None:
                return float(latest)
        return float(self._gpu.total_energy_mj())

    def since(self, start_mj: float, duration_s: float) -> float:
        """Joules since the reading `start_mj` (power × time on GPUs without a counter)."""
        if self.has_counter:
            return (self.read_mj() - start_mj) / 1000.0
        return self._gpu.power_usage_mw() / 1000.0 * duration_s

    def close_round(
        self, record: RoundRecord, num_indices: int, *, settle_s: float = 0.0
    ) -> list[EnergyWindow] | None:
        """The round cut at the counter's refreshes (None without a watcher); with a
        periodic counter, also spreads the round's mean power over its steps.

        `settle_s`: the GPU's measured clock switch, after which the windows begin
        (`energy_windows`)."""
        poller = self._poller
        if poller is None:
            return None
        if poller.error is not None:
            logger.warning(
                "Rank %d: the energy counter's watcher stopped (%s); no energy windows",
                self._rank,
                poller.error,
            )
            self._poller = None
            return None
        ticks = poller.ticks(record.start_s, record.end_s)
        windows = energy_windows(
            ticks,
            record.intervals,
            num_indices,
            start_s=record.start_s,
            end_s=record.end_s,
            settle_s=settle_s,
        )
        poller.forget(record.end_s - 1.0)
        if poller.period_s:
            power_w = mean_power_w(ticks, record.end_s - record.start_s)
            if power_w is not None:
                record.spread(power_w)
        return windows

    def close(self) -> None:
        """Stop the counter's watcher (idempotent)."""
        poller, self._poller = self._poller, None
        if poller is not None:
            poller.close()
