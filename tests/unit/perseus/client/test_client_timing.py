"""The hook's timings behind one interface, run on an emulated GPU (no process group)."""

from __future__ import annotations

import time

import pytest

from perseus.client.gpu.emulation import InstructionEmulator
from perseus.client.gpu.frequency import FrequencyController
from perseus.client.gpu.meter import EnergyReader
from perseus.client.gpu.rounds import RoundRecord
from perseus.client.gpu.timing import EmulatedTiming, SyncTiming, Timing, choose_timing
from perseus.client.settings import EmulationSettings
from perseus.errors import ConfigurationError
from zeus_power.device.emulated import EmulatedGPU


def _run_step(timing: Timing, record: RoundRecord, clocks: list[int]) -> None:
    record.start_step()
    timing.step_begin(record, first=True)
    for index, freq in enumerate(clocks):
        timing.instruction_begin("forward", freq, 0, index)
        time.sleep(0.002)
        timing.instruction_end(
            record, name="forward", freq_mhz=freq, index=index, step=0, stage=0, microbatch=index
        )
    timing.step_end(record, step=0, slot=0)
    timing.round_end(record)


def test_sync_timing_shares_the_steps_energy_by_time() -> None:
    gpu = EmulatedGPU(0, sensors="ideal")
    reader = EnergyReader(gpu, rank=0)
    freq = FrequencyController(gpu, inline=True)
    trace: list[dict] = []
    record = RoundRecord(0, trace.append)
    timing = SyncTiming(reader, freq, lambda: None)
    try:
        _run_step(timing, record, [1410, 1005])
    finally:
        timing.close()
        freq.close()
        reader.close()
    times = record.time_breakdown["forward"][0]
    energies = record.energy_breakdown["forward"][0]
    assert len(times) == 2 and all(t >= 0.002 for t in times)
    power_w = record.iter_energy[0] / record.iter_time[0]
    assert energies == pytest.approx([power_w * t for t in times])
    assert [r["kind"] for r in trace] == ["instruction", "instruction", "step"]
    assert [r["freq_mhz"] for r in trace[:2]] == [1410, 1005]
    assert [i for i, _, _ in record.intervals] == [0, 1] and record.end_s > record.start_s


def test_emulated_timing_stretches_to_the_clock_asked_for() -> None:
    gpu = EmulatedGPU(0, sensors="ideal")
    reader = EnergyReader(gpu, rank=0)
    freq = FrequencyController(gpu, inline=True)
    emulator = InstructionEmulator(
        gpu, EmulationSettings(nominal=True, kinds="uniform"), nominal_time_s={"forward": 0.01}
    )
    record = RoundRecord(0, lambda r: None)
    timing = EmulatedTiming(reader, freq, lambda: None, emulator=emulator, stand_in=gpu)
    top = gpu.spec.max_sm_clock_mhz
    try:
        _run_step(timing, record, [top, top // 2])
    finally:
        timing.close()
        emulator.close()
        freq.close()
        reader.close()
    fast, slow = record.time_breakdown["forward"][0]
    assert fast == pytest.approx(0.01, rel=0.05)
    assert slow == pytest.approx(0.01 * top / (top // 2), rel=0.05)  # compute-bound: f_max / f


def test_events_timing_is_chosen_only_where_it_can_run() -> None:
    gpu = EmulatedGPU(0)
    assert choose_timing("auto", gpu, has_counter=True) == "sync"  # emulated: no CUDA events
    assert choose_timing("sync", gpu, has_counter=True) == "sync"
    with pytest.raises(ConfigurationError, match="needs a real GPU with an energy counter"):
        choose_timing("events", gpu, has_counter=True)


def test_a_round_reports_the_idle_seconds_before_each_instruction() -> None:
    """What the coordinator needs to count a clock change's landing in wall time: per index
    of the order, the mean idle gap before it (the gap after the last index's end wraps to
    the next step's first)."""
    record = RoundRecord(0, lambda r: None)
    for base in (0.0, 1.0):
        record.start_step()
        record.instruction("forward", 0.1, 1.0)
        record.instruction("forward", 0.1, 1.0)
        record.step(0, 0.4, 2.0)
        record.interval(0, base, base + 0.1)
        record.interval(1, base + 0.3, base + 0.4)  # waited 0.2 s for a peer
    result = record.result(0, None)
    # Index 0 followed index 1 once (0.6 s across the step boundary): its mean is 0.6 s.
    assert result.idle_before_s == pytest.approx([0.6, 0.2])
    assert RoundRecord(1, lambda r: None).idle_before_s() is None
