"""How the hook times instructions: one interface (`Timing`), one class per way, chosen once.

- `SyncTiming` (``sync``): a device synchronisation around each instruction, its time on
  the host clock; each step's energy from two energy-counter readings around it, shared
  by its instructions in proportion to their times (the step's mean power).
- `EmulatedTiming` (``sync`` on a GPU with a `stand_in`): sync timing that also stretches
  each instruction to the locked clock and tells the emulated GPU what it draws
  (`perseus.client.gpu.emulation`); energy is still read from the GPU's sensors only.
- `EventsTiming` (``events``): CUDA events and a watcher thread (`perseus.client.gpu.events`),
  one synchronisation per iteration; each step's energy read by the watcher, shared by
  time at the round's end. Real CUDA GPUs with an energy counter only.

On an H100, sync timing cost +149 % per iteration and events +0.8 % (10 iterations a
round; ``docs/measurements/h100-2026-11-24``). `choose_timing` resolves ``auto``: events
where they can run, else sync. Whatever the timing, the round's energy windows and mean
power come from the `EnergyReader` (`perseus.client.gpu.meter`) at the round's end.

The hook calls, per round: ``step_begin``, then per instruction ``instruction_begin`` /
``instruction_end``, ``step_end``; after the round's last step ``round_end``; ``discard``
when a training step failed.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar

from perseus.client.gpu.emulation import InstructionEmulator
from perseus.client.gpu.events import EventTimer, InstructionTiming
from perseus.client.gpu.frequency import FrequencyController
from perseus.client.gpu.meter import EnergyReader
from perseus.client.gpu.rounds import RoundRecord
from perseus.errors import ConfigurationError
from zeus_power.device.base import GPU, StandIn

__all__ = ["EmulatedTiming", "EventsTiming", "SyncTiming", "Timing", "choose_timing"]


def _cuda_available() -> bool:
    """Whether torch sees a CUDA device (CUDA events can time instructions)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def choose_timing(requested: str, gpu: GPU, *, has_counter: bool) -> str:
    """``sync`` or ``events`` for `requested` (``auto``: events where they can run);
    `ConfigurationError` for events on an emulated GPU or one without an energy counter."""
    real = gpu.stand_in is None and has_counter
    if requested == "auto":
        return "events" if real and _cuda_available() else "sync"
    if requested == "events" and not real:
        raise ConfigurationError(
            "timing='events' needs a real GPU with an energy counter; "
            f"{gpu!r} is emulated or has none: use timing='sync'"
        )
    return requested


class Timing(ABC):
    """Measures a rank's instructions and steps into the round's `RoundRecord`."""

    name: ClassVar[str]

    @abstractmethod
    def step_begin(self, record: RoundRecord, *, first: bool) -> None:
        """A step begins (`first`: the round's first)."""

    @abstractmethod
    def instruction_begin(
        self, name: str, freq_mhz: int, stage: int | None, microbatch: int | None
    ) -> None:
        """Instruction `name` begins; it runs at `freq_mhz`."""

    @abstractmethod
    def instruction_end(
        self,
        record: RoundRecord,
        *,
        name: str,
        freq_mhz: int,
        index: int,
        step: int,
        stage: int | None,
        microbatch: int | None,
    ) -> None:
        """Instruction `name` (`index` in its iteration, of step `step`) ended."""

    @abstractmethod
    def step_end(self, record: RoundRecord, *, step: int, slot: int) -> None:
        """Step `step` (the round's `slot`-th) ended."""

    @abstractmethod
    def round_end(self, record: RoundRecord) -> None:
        """The round's last step ended: anything measured late goes into `record`."""

    @abstractmethod
    def discard(self) -> None:
        """Forget the step in progress (the training step failed)."""

    @abstractmethod
    def close(self) -> None:
        """Stop what this timing started (idempotent)."""


class SyncTiming(Timing):
    """A device synchronisation around each instruction (module docstring)."""

    name = "sync"

    def __init__(
        self, meter: EnergyReader, freq: FrequencyController, sync: Callable[[], None]
    ) -> None:
        self._meter = meter
        self._freq = freq
        self._sync = sync
        self._step_instrs: list[tuple[str, float]] = []
        """The step's instructions (name, time) until its energy is known."""
        self._step_start_s = 0.0
        self._step_start_mj = 0.0
        self._instr_start_s = 0.0
        self._instr_stage: int | None = None
        self._instr_microbatch: int | None = None

    def step_begin(self, record: RoundRecord, *, first: bool) -> None:
        self._step_instrs = []
        self._sync()
        self._step_start_mj = self._meter.read_mj()
        self._step_start_s = time.perf_counter()
        if first:
            record.start_s = self._step_start_s

    def instruction_begin(
        self, name: str, freq_mhz: int, stage: int | None, microbatch: int | None
    ) -> None:
        self._freq.request(freq_mhz)
        self._sync()
        self._started(name, freq_mhz)
        self._instr_stage, self._instr_microbatch = stage, microbatch
        self._instr_start_s = time.perf_counter()

    def _started(self, name: str, freq_mhz: int) -> None:
        """The instruction's clock was asked for and the device is idle (emulation hooks in)."""

    def _measure(self, name: str, freq_mhz: int, stage: int | None) -> tuple[float, float, int]:
        """(duration, compute seconds or -1, clock) of the instruction that just ended."""
        return time.perf_counter() - self._instr_start_s, -1.0, freq_mhz

    def instruction_end(
        self,
        record: RoundRecord,
        *,
        name: str,
        freq_mhz: int,
        index: int,
        step: int,
        stage: int | None,
        microbatch: int | None,
    ) -> None:
        self._sync()
        stage = stage if stage is not None else self._instr_stage
        microbatch = microbatch if microbatch is not None else self._instr_microbatch
        duration_s, compute_s, freq_mhz = self._measure(name, freq_mhz, stage)
        record.interval(index, self._instr_start_s, self._instr_start_s + duration_s)
        record.trace_instruction(
            step=step,
            index=index,
            name=name,
            stage=stage,
            microbatch=microbatch,
            freq_mhz=freq_mhz,
            time_s=duration_s,
            compute_s=compute_s,
        )
        # Its energy share is known once the step's energy is (step_end).
        self._step_instrs.append((name, duration_s))

    def step_end(self, record: RoundRecord, *, step: int, slot: int) -> None:
        self._sync()
        end_s = time.perf_counter()
        iter_time_s = end_s - self._step_start_s
        iter_energy_j = self._meter.since(self._step_start_mj, iter_time_s)
        power_w = iter_energy_j / iter_time_s if iter_time_s > 0 else 0.0
        for name, time_s in self._step_instrs:
            record.instruction(name, time_s, power_w * time_s)
        self._step_instrs = []
        record.step(step, iter_time_s, iter_energy_j)
        record.end_s = end_s

    def round_end(self, record: RoundRecord) -> None:
        pass  # every step was measured as it ended

    def discard(self) -> None:
        self._step_instrs = []

    def close(self) -> None:
        pass  # no thread of its own: the hook stops the frequency controller


class EmulatedTiming(SyncTiming):
    """Sync timing on a GPU with a stand-in: stretches each instruction to its clock."""

    def __init__(
        self,
        meter: EnergyReader,
        freq: FrequencyController,
        sync: Callable[[], None],
        *,
        emulator: InstructionEmulator,
        stand_in: StandIn,
    ) -> None:
        super().__init__(meter, freq, sync)
        self._emulator = emulator
        self._stand_in = stand_in

    def _started(self, name: str, freq_mhz: int) -> None:
        # The emulated switch starts now, not whenever the worker thread gets to it;
        # the emulated GPU draws the instruction's power from now on.
        self._freq.wait_applied()
        self._emulator.begin(name, freq_mhz)

    def _measure(self, name: str, freq_mhz: int, stage: int | None) -> tuple[float, float, int]:
        compute_end_s = time.perf_counter()
        self._freq.wait_applied()
        freq_mhz = self._stand_in.target_sm_clock_mhz()
        duration_s = self._emulator.finish(
            name, self._instr_start_s, freq_mhz, compute_end_s=compute_end_s, stage=stage
        )
        return duration_s, self._emulator.last_compute_s, freq_mhz


class EventsTiming(Timing):
    """CUDA events and a watcher thread (module docstring)."""

    name = "events"

    def __init__(self, meter: EnergyReader, freq: FrequencyController, device_id: int) -> None:
        # The watcher asks for each instruction's clock when the GPU gets there.
        self._events = EventTimer(device_id, meter.read_mj, freq.request)
        self._steps: list[tuple[int, int, float, list[InstructionTiming]]] = []
        """Each step of the round so far (step, slot, time, instructions)."""
        self._step_start_s = 0.0

    def step_begin(self, record: RoundRecord, *, first: bool) -> None:
        self._events.step_begin()  # the counter is read off this thread
        self._step_start_s = time.perf_counter()

    def instruction_begin(
        self, name: str, freq_mhz: int, stage: int | None, microbatch: int | None
    ) -> None:
        self._events.begin(name, freq_mhz, stage, microbatch)

    def instruction_end(
        self,
        record: RoundRecord,
        *,
        name: str,
        freq_mhz: int,
        index: int,
        step: int,
        stage: int | None,
        microbatch: int | None,
    ) -> None:
        self._events.end()  # measured at the round's end

    def step_end(self, record: RoundRecord, *, step: int, slot: int) -> None:
        """The step's instruction times now, its energy at the round's end."""
        timings = self._events.step_end()
        iter_time_s = time.perf_counter() - self._step_start_s
        self._steps.append((step, slot, iter_time_s, timings))

    def round_end(self, record: RoundRecord) -> None:
        """Each step's energy (read by the watcher), shared by time."""
        steps, self._steps = self._steps, []
        energies = self._events.step_energies_j()
        spans = self._events.last_spans
        for (step, slot, iter_time_s, timings), energy_j, (begin_s, _) in zip(
            steps, energies, spans, strict=True
        ):
            power_w = energy_j / iter_time_s if iter_time_s > 0 else 0.0
            for index, t in enumerate(timings):
                start_s = begin_s + t.offset_s  # the GPU's own timestamps, from the step's mark
                record.interval(index, start_s, start_s + t.time_s)
                record.instruction(t.name, t.time_s, power_w * t.time_s, slot=slot)
                record.trace_instruction(
                    step=step,
                    index=index,
                    name=t.name,
                    stage=t.stage,
                    microbatch=t.microbatch,
                    freq_mhz=t.freq_mhz,
                    time_s=t.time_s,
                )
            record.step(step, iter_time_s, energy_j)
        if spans:
            record.start_s, record.end_s = spans[0][0], spans[-1][1]

    def discard(self) -> None:
        self._events.discard()

    def close(self) -> None:
        self._events.close()
