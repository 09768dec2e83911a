"""The daemon's GPU state in-process (`zeus_power.gpud.state`): who owns a GPU, and when
its defaults are restored.

The GPUs are emulated A40s whose driver calls a test can hold in flight (a real
``nvmlDeviceSetGpuLockedClocks`` takes 10-20 ms, long enough for the reaper to run beside
it); peers are real processes of this machine: a live one (this test) and one that was
started and has exited.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time

import pytest

from zeus_power.device import GPUError
from zeus_power.device.emulated import EmulatedGPU
from zeus_power.gpud.peers import Peer, start_ticks
from zeus_power.gpud.state import GpuState, StoppingError

LOCK = "set_gpu_locked_clocks"
A40_MAX_MHZ = 1740


class HeldDriver(EmulatedGPU):
    """An emulated A40 whose next `lock_sm_clocks` waits in the driver until released."""

    def __init__(self) -> None:
        super().__init__(0, gpu_type="A40")
        self.hold = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def lock_sm_clocks(self, min_mhz: int, max_mhz: int) -> None:
        if self.hold:
            self.hold = False
            self.entered.set()
            if not self.release.wait(10):
                raise TimeoutError("the test never released the driver call")
        super().lock_sm_clocks(min_mhz, max_mhz)


class LostDriver(EmulatedGPU):
    """An emulated A40 whose driver refuses clock resets while `lost` (a GPU off the bus)."""

    def __init__(self) -> None:
        super().__init__(0, gpu_type="A40")
        self.lost = False
        self.resets = 0

    def reset_sm_clocks(self) -> None:
        self.resets += 1
        if self.lost:
            raise GPUError("Unknown Error (the GPU has fallen off the bus)", gpu_index=0)
        super().reset_sm_clocks()


def _clocks(mhz: int) -> dict[str, int]:
    return {"min_clock_mhz": mhz, "max_clock_mhz": mhz}


@pytest.fixture
def live() -> Peer:
    ticks = start_ticks(os.getpid())
    assert ticks is not None
    return Peer(os.getpid(), os.getuid(), ticks)


@pytest.fixture
def exited() -> Peer:
    """A peer that ran when it set clocks and has exited since."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ticks = start_ticks(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert ticks is not None
    return Peer(proc.pid, os.getuid(), ticks)


def test_the_reaper_never_undoes_what_a_new_live_owner_just_set(live, exited):
    """A dead client's GPU is taken over by a live one while the live one's clock lock is in
    the driver: the reaper, running at that moment, must see the new owner and leave it be."""
    gpu = HeldDriver()
    state = GpuState([gpu])
    assert state.write(LOCK, [0], _clocks(900), exited) == {}
    gpu.hold = True
    writer = threading.Thread(target=state.write, args=(LOCK, [0], _clocks(1200), live))
    writer.start()
    assert gpu.entered.wait(10)
    reaper = threading.Thread(target=state.reap)
    reaper.start()
    time.sleep(0.3)  # the reaper is now as far as it gets while the write holds the GPU
    gpu.release.set()
    writer.join(10)
    reaper.join(10)
    assert gpu.current_sm_clock_mhz() == 1200, "the reaper undid the live owner's clocks"
    assert state.slots[0].owner == live
    assert state.reap() == []  # and later checks leave the live owner alone too
    assert gpu.current_sm_clock_mhz() == 1200


def test_a_refused_restore_is_logged_once_then_retried_with_backoff(exited, caplog):
    caplog.set_level(logging.DEBUG, logger="zeus_power.gpud")
    now = [1000.0]
    gpu = LostDriver()
    state = GpuState([gpu], clock=lambda: now[0])
    state.write(LOCK, [0], _clocks(900), exited)
    gpu.lost = True
    for _ in range(20):  # 10 s of reaper ticks, 0.5 s apart
        assert state.reap() == []
        now[0] += 0.5
    assert state.slots[0].owner is None  # no dead owner left to check every tick
    assert gpu.resets == 4  # tried at 0, 1, 3 and 7 s: the delay doubles
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors
    assert f"GPU 0: could not restore its defaults (client pid {exited.pid} exited)" in errors[0]
    assert "Its clocks stay as set" in errors[0] and "nvidia-smi -i 0 -rgc" in errors[0]
    assert gpu.current_sm_clock_mhz() == 900
    gpu.lost = False
    now[0] += 60
    assert state.reap() == [0]
    assert gpu.current_sm_clock_mhz() == A40_MAX_MHZ
    assert caplog.records[-1].getMessage() == (
        f"GPU 0: clocks and power limit restored to defaults (client pid {exited.pid} exited), "
        "at try 5"
    )
    now[0] += 600
    assert state.reap() == [] and gpu.resets == 5


def test_a_client_writing_to_an_orphaned_gpu_takes_it_over(exited, live):
    now = [0.0]
    gpu = LostDriver()
    state = GpuState([gpu], clock=lambda: now[0])
    state.write(LOCK, [0], _clocks(900), exited)
    gpu.lost = True
    state.reap()
    gpu.lost = False
    assert state.write(LOCK, [0], _clocks(1200), live) == {}
    now[0] += 600
    assert state.reap() == []
    assert gpu.current_sm_clock_mhz() == 1200 and state.slots[0].owner == live


def test_a_restore_refused_at_exit_says_how_to_reset_by_hand(live, caplog):
    gpu = LostDriver()
    state = GpuState([gpu])
    state.write(LOCK, [0], _clocks(900), live)
    gpu.lost = True
    state.close("daemon exiting")
    (error,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert "(daemon exiting)" in error and "nvidia-smi -i 0 -rgc" in error
    assert "retries" not in error


def test_no_write_outlives_the_restore_at_exit(live):
    gpu = EmulatedGPU(0, gpu_type="A40")
    state = GpuState([gpu])
    state.write(LOCK, [0], _clocks(900), live)
    state.close("daemon exiting")
    (refused,) = state.write(LOCK, [0], _clocks(1200), live).values()
    assert isinstance(refused, StoppingError) and "the daemon is stopping" in str(refused)
    assert gpu.current_sm_clock_mhz() == A40_MAX_MHZ and not state.slots[0].changed
