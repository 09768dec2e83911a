"""A rank's GPU's power limit and idle power, as it measures them at start and registers them
(`RankInfo.power_limit_w`, `RankInfo.idle_power_w`), on emulated GPUs with their sensors."""

from __future__ import annotations

import threading
import time

import pytest

from perseus.client.gpu.meter import IDLE_MAX_WAIT_S, EnergyReader
from perseus.client.gpu.rank_gpu import RankGPU, read_power_limit_w
from perseus.client.options import HookOptions
from perseus.client.settings import ClientSettings
from zeus_power.device.base import GPUNotSupportedError
from zeus_power.device.emulated import EmulatedGPU


class NoPowerLimitGPU(EmulatedGPU):
    """An emulated GPU whose driver will not say its power limit (as some vGPUs do not)."""

    def get_power_limit_mw(self) -> int:
        raise GPUNotSupportedError("no power limit here", gpu_index=self.index)


@pytest.mark.parametrize(
    ("gpu_type", "sensors"),
    [("A100-SXM", "real"), ("H100-SXM", "real"), ("A40", "real"), ("A100-SXM", "ideal")],
)
def test_the_meter_measures_idle_power_from_the_refreshes_it_times_the_period_with(
    gpu_type: str, sensors: str
) -> None:
    gpu = EmulatedGPU(0, gpu_type=gpu_type, sensors=sensors)
    start = time.perf_counter()
    reader = EnergyReader(gpu, rank=0)
    took_s = time.perf_counter() - start
    try:
        # 100 ms refreshes with 1 % noise each: three of them give the idle power within ~1 %.
        assert reader.idle_power_w == pytest.approx(gpu.idle_power_w, rel=0.04)
        if sensors == "real":
            assert reader.refresh_s == pytest.approx(0.1, abs=0.01)
            # The period's own measurement (three refreshes after the first) is all it takes.
            assert took_s < 0.6 + IDLE_MAX_WAIT_S
        else:  # continuous: it waits for the watcher's reads to span 0.1 s, no longer
            assert reader.refresh_s == 0.0
            assert took_s < 0.1 + IDLE_MAX_WAIT_S
    finally:
        reader.close()


def test_a_gpu_without_an_energy_counter_measures_no_idle_power() -> None:
    reader = EnergyReader(EmulatedGPU(0, energy_counter=False), rank=0)
    assert reader.refresh_s is None and reader.idle_power_w is None


def test_a_gpu_busy_at_start_reports_no_idle_power() -> None:
    """Work running when the meter opens, and ending while it measures: the refreshes do not
    hold steady, and the power they show is not the idle one."""
    gpu = EmulatedGPU(0)
    began = gpu.clock()
    gpu.begin_busy(300.0)

    def end() -> None:
        lasted = gpu.clock() - began
        gpu.end_busy(lasted, 300.0 * lasted)

    timer = threading.Timer(0.15, end)
    timer.start()
    reader = EnergyReader(gpu, rank=0)
    timer.join()
    try:
        assert reader.refresh_s == pytest.approx(0.1, abs=0.01)
        assert reader.idle_power_w is None
    finally:
        reader.close()


def test_the_power_limit_is_the_one_in_force_or_none() -> None:
    gpu = EmulatedGPU(0)  # A100-SXM: 400 W by default
    assert read_power_limit_w(gpu) == gpu.get_power_limit_mw() / 1000 == 400.0
    gpu.set_power_limit_mw(300_000)
    assert read_power_limit_w(gpu) == 300.0
    assert read_power_limit_w(NoPowerLimitGPU(0)) is None  # never fails registration


def _rank_gpu(gpu: EmulatedGPU) -> RankGPU:
    options = HookOptions(gpu=gpu, sync=lambda: None, nominal_time_s={"forward": 0.01})
    return RankGPU(0, 0, 0, options, ClientSettings.load())


def test_a_ranks_facts_carry_its_gpus_power_limit_and_idle_power() -> None:
    gpu = EmulatedGPU(0)
    side = _rank_gpu(gpu)
    try:
        facts = side.facts()
        assert facts.power_limit_w == 400.0
        assert facts.idle_power_w == pytest.approx(gpu.idle_power_w, rel=0.04)
        assert facts.energy_refresh_s == pytest.approx(0.1, abs=0.01)
        assert side.facts() == facts  # measured once: the meter is opened once
    finally:
        side.stop()
    side = _rank_gpu(NoPowerLimitGPU(0, energy_counter=False))
    try:
        facts = side.facts()
        assert facts.power_limit_w is None and facts.idle_power_w is None
    finally:
        side.stop()


def test_a_rounds_windows_begin_once_its_first_clock_change_has_landed() -> None:
    """The change a round starts with is made once: its seconds at the last round's clock
    would be charged to every window of the round. The windows begin the GPU's switch
    latency after the round's first instruction started, so that instruction, run wholly
    inside the switch, is in none of them; without a latency it is."""
    from perseus.client.gpu.rounds import RoundRecord

    gpu = EmulatedGPU(0, sensors="ideal")  # a continuous counter: a window every ~20 ms
    reader = EnergyReader(gpu, rank=0)
    try:
        record = RoundRecord(0, lambda _: None)
        record.start_s = time.perf_counter()
        time.sleep(0.03)
        record.interval(0, record.start_s, time.perf_counter())
        time.sleep(0.05)
        second = time.perf_counter()
        time.sleep(0.03)
        record.interval(1, second, time.perf_counter())
        time.sleep(0.1)
        record.end_s = time.perf_counter()
        plain = reader.close_round(record, 2)
        settled = reader.close_round(record, 2, settle_s=0.04)
        assert plain and settled
        assert sum(w.busy_s[0] for w in plain) > 0.01
        assert sum(w.busy_s[0] for w in settled) == 0.0
        assert sum(w.busy_s[1] for w in settled) == pytest.approx(0.03, abs=0.005)
    finally:
        reader.close()
