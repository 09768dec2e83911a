"""The daemon's GPU state in-process (`zeus_power.gpud.state`): who owns a GPU, and when
its defaults are restored.

The GPUs are emulated A40s whose driver calls a test can hold in flight (a real
``nvmlDeviceSetGpuLockedClocks`` takes 10-20 ms, long enough for the reaper to run beside
it); peers are real processes of this machine: a live one (this test) and one that was
started and has exited.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from zeus_power.device.emulated import EmulatedGPU
from zeus_power.gpud.peers import Peer, start_ticks
from zeus_power.gpud.state import GpuState

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
