"""A rank's GPU as the hook drives and measures it: opened once, then its emulator, its
clocks, its energy meter, its frequency controller and its timing, each made once.

`RankGPU` opens the GPU (or takes the one given), sets up emulation when the GPU has a
`stand_in` (an `EmulatedGPU`: it runs no kernels itself, so the hook stretches
instructions and tells it what they draw; `perseus.client.gpu.emulation`), chooses the timing
(`perseus.client.gpu.timing.choose_timing`), and measures how long a clock switch takes. What
starts threads (the energy counter's watcher, the frequency controller, the events
watcher) starts when the hook connects, and `stop` ends all of it, whatever was started.
"""

from __future__ import annotations

import logging

from perseus.client.bootstrap import device_sync
from perseus.client.facts import GpuFacts
from perseus.client.gpu.emulation import InstructionEmulator
from perseus.client.gpu.frequency import FrequencyController, measure_switch_latency
from perseus.client.gpu.meter import EnergyReader
from perseus.client.gpu.rounds import RoundRecord
from perseus.client.gpu.timing import (
    EmulatedTiming,
    EventsTiming,
    SyncTiming,
    Timing,
    choose_timing,
)
from perseus.client.options import HookOptions
from perseus.client.settings import ClientSettings
from perseus.protocol import MAX_POWER_W, EnergyWindow
from zeus_power.device.base import GPU, GPUError

__all__ = ["RankGPU", "read_power_limit_w"]

logger = logging.getLogger(__name__)


class RankGPU:
    """One rank's GPU and the pieces that drive and measure it (module docstring)."""

    def __init__(
        self,
        rank: int,
        pp_rank: int,
        device_id: int,
        options: HookOptions,
        settings: ClientSettings,
    ) -> None:
        gpu = options.gpu
        if gpu is None:
            from zeus_power.device import open_gpus

            # Emulated only when asked for (ZEUS_GPU_BACKEND=emulated): without a driver and
            # without the opt-in this raises a GPUInitError that names it.
            gpu = open_gpus([device_id])[0]
        self.gpu = gpu
        self.device_id = device_id
        self._rank = rank
        self.emulated = gpu.emulated
        """This rank's GPU is emulated; the rank registers so, and its profile and plan say so."""
        if self.emulated:
            logger.info("Rank %d: GPU %d is emulated (%s)", rank, device_id, gpu.name())
        self._sync = options.sync if options.sync is not None else device_sync(device_id)
        self.emulator: InstructionEmulator | None = None
        if gpu.stand_in is not None:
            self.emulator = InstructionEmulator(
                gpu.stand_in,
                settings.emulation,
                nominal_time_s=options.nominal_time_s,
                rank=rank,
                stage=pp_rank,
            )
        has_counter = gpu.supports_energy_counter()
        self.timing = choose_timing(settings.timing, gpu, has_counter=has_counter)
        self.frequencies = sorted(gpu.supported_sm_clocks_mhz(), reverse=True)
        self.switch_latency_s = measure_switch_latency(gpu, self.frequencies)
        if self.switch_latency_s is not None:
            logger.debug(
                "Rank %d: GPU %d applies a locked clock in %.1f ms (measured)",
                rank,
                device_id,
                self.switch_latency_s * 1000,
            )
        self._meter: EnergyReader | None = None
        self._freq: FrequencyController | None = None
        self._timing: Timing | None = None

    def open_meter(self) -> EnergyReader:
        """Start watching the energy counter (measures its refresh period)."""
        if self._meter is None:
            self._meter = EnergyReader(self.gpu, rank=self._rank)
        return self._meter

    def facts(self) -> GpuFacts:
        """What the rank tells the job and the coordinator about its GPU (its power limit
        and idle power too, measured here the first time, while the GPU is idle)."""
        meter = self.open_meter()
        power_limit_w = read_power_limit_w(self.gpu)
        idle_power_w = meter.idle_power_w
        if idle_power_w is not None and power_limit_w is not None and idle_power_w > power_limit_w:
            logger.warning(
                "Rank %d: GPU %d drew %.1f W at start, above its power limit of %.1f W: it was "
                "not idle; its idle power is not reported",
                self._rank,
                self.device_id,
                idle_power_w,
                power_limit_w,
            )
            idle_power_w = None
        logger.debug(
            "Rank %d: GPU %d's power limit is %s, its idle power %s",
            self._rank,
            self.device_id,
            "unknown" if power_limit_w is None else f"{power_limit_w:.1f} W",
            "not measured" if idle_power_w is None else f"{idle_power_w:.1f} W (measured)",
        )
        return GpuFacts(
            device_id=self.device_id,
            name=self.gpu.name(),
            frequencies=self.frequencies,
            emulated=self.emulated,
            switch_latency_s=self.switch_latency_s,
            energy_refresh_s=meter.refresh_s,
            power_limit_w=power_limit_w,
            idle_power_w=idle_power_w,
        )

    def start_timing(self) -> Timing:
        """The frequency controller and the timing chosen (once)."""
        if self._timing is not None:
            return self._timing
        meter = self.open_meter()
        # A GPU that emulates itself changes clocks in memory: no worker thread to wake.
        self._freq = freq = FrequencyController(self.gpu, inline=self.gpu.stand_in is self.gpu)
        timing: Timing
        if self.timing == "events":
            timing = EventsTiming(meter, freq, self.device_id)
        elif self.emulator is not None and self.gpu.stand_in is not None:
            timing = EmulatedTiming(
                meter, freq, self._sync, emulator=self.emulator, stand_in=self.gpu.stand_in
            )
        else:
            timing = SyncTiming(meter, freq, self._sync)
        self._timing = timing
        return timing

    def close_round(self, record: RoundRecord, num_indices: int) -> list[EnergyWindow] | None:
        """The round's energy windows (`EnergyReader.close_round`), from when the clock
        change the round starts with has landed."""
        if self._meter is None:
            return None
        return self._meter.close_round(record, num_indices, settle_s=self.switch_latency_s or 0.0)

    def stop(self) -> None:
        """Stop the counter's watcher, the emulator, the timing and the frequency controller
        (restoring the GPU's clocks), whichever were started. Idempotent."""
        meter, self._meter = self._meter, None
        if meter is not None:
            meter.close()
        emulator, self.emulator = self.emulator, None
        if emulator is not None:
            emulator.close()
        timing, self._timing = self._timing, None
        if timing is not None:
            timing.close()
        freq, self._freq = self._freq, None
        if freq is not None:
            freq.close()


def read_power_limit_w(gpu: GPU) -> float | None:
    """The power limit in force on `gpu`, W; None when the GPU will not say (a `GPUError`)
    or says something no GPU could (registration never fails for it)."""
    try:
        limit_w = gpu.get_power_limit_mw() / 1000.0
    except GPUError as exc:
        logger.debug("GPU %d: no power limit to report (%s)", gpu.index, exc)
        return None
    if not (1.0 <= limit_w <= MAX_POWER_W):  # NaN too
        logger.warning("GPU %d reports a power limit of %r W; not reported", gpu.index, limit_w)
        return None
    return limit_w
