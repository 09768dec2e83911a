"""The frequency controller: one worker thread per GPU that locks the SM clock, and the
measurement of how long a clock change takes to come into force on this rank's GPU.

The training thread hands each instruction's clock to `FrequencyController.request` and goes
on; the worker applies it, so the loop never waits on the driver.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import statistics
import threading
import time

from perseus.errors import RankError
from zeus_power.device.base import GPU, GPUError

__all__ = ["FrequencyController", "measure_switch_latency"]

logger = logging.getLogger(__name__)

SWITCH_SAMPLES = 4
"""Clock changes timed by `measure_switch_latency` (alternately down and up)."""
SWITCH_TIMEOUT_S = 1.0
"""Longest wait for one change to show before the measurement gives up (real GPUs apply a
locked clock in 10-20 ms)."""
_POLL_S = 0.0002


def _wait_for_clock(gpu: GPU, freq_mhz: int, timeout_s: float) -> float | None:
    """Seconds until the GPU reports `freq_mhz` as its current SM clock (None: not within
    `timeout_s`)."""
    start = time.perf_counter()
    while True:
        if gpu.current_sm_clock_mhz() == freq_mhz:
            return time.perf_counter() - start
        if time.perf_counter() - start > timeout_s:
            return None
        time.sleep(_POLL_S)


def measure_switch_latency(
    gpu: GPU,
    frequencies: list[int],
    *,
    samples: int = SWITCH_SAMPLES,
    timeout_s: float = SWITCH_TIMEOUT_S,
) -> float | None:
    """How long this GPU takes to apply a locked SM clock, in seconds: the median over
    `samples` changes between its highest clock and one well below it, each timed from the
    lock call until the driver reports the new clock (`GPU.current_sm_clock_mhz`).

    The same on every backend: an emulated GPU is timed the way a real one is, never asked
    for its settings. Returns None (and logs why) where it cannot be measured: no clock
    reading, no permission to lock clocks, fewer than two clocks, or a change that never
    shows. The GPU's clocks are reset afterwards.
    """
    clocks = sorted(set(frequencies), reverse=True)
    if len(clocks) < 2:
        return None
    high, low = clocks[0], clocks[len(clocks) // 2]
    times: list[float] = []
    try:
        gpu.lock_sm_clocks(high, high)
        if _wait_for_clock(gpu, high, timeout_s) is None:
            logger.info(
                "GPU %d: the clock never showed %d MHz; switch latency unknown", gpu.index, high
            )
            return None
        for k in range(samples):
            target = low if k % 2 == 0 else high
            start = time.perf_counter()
            gpu.lock_sm_clocks(target, target)
            waited = _wait_for_clock(gpu, target, timeout_s)
            if waited is None:
                logger.info(
                    "GPU %d: a change to %d MHz did not show within %g s; switch latency unknown",
                    gpu.index,
                    target,
                    timeout_s,
                )
                return None
            times.append(time.perf_counter() - start)
    except GPUError as exc:
        logger.info("GPU %d: switch latency not measured: %s", gpu.index, exc)
        return None
    finally:
        with contextlib.suppress(GPUError):
            gpu.reset_sm_clocks()
    return statistics.median(times)


class FrequencyController:
    """Applies SM clocks to a GPU from one background thread, in request order.

    `request` never blocks; consecutive requests that pile up are coalesced (only the newest
    is applied). An error raised by the GPU is re-raised in the caller's thread on the next
    `request`, `wait_applied` or `close`. `close` always resets the GPU's clocks once any
    clock was requested.

    With `inline=True` there is no worker: `request` locks the clock in the caller's thread
    and raises the GPU's error there. That is for GPUs whose clock change is a memory write
    (an in-process `EmulatedGPU`), where handing it to a thread costs more than doing it: on
    a loaded 2-core host the handoff measured 0.1-0.3 ms per changed clock on average and up
    to 3.4 ms, all of it on the training thread's critical path.
    """

    def __init__(self, gpu: GPU, *, inline: bool = False) -> None:
        self.gpu = gpu
        self.inline = inline
        self._queue: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._cond = threading.Condition()
        self._requested = 0
        self._applied = 0
        self._last_requested_mhz: int | None = None
        self._error: BaseException | None = None
        self._closed = False
        self._thread: threading.Thread | None = None
        if inline:
            return
        self._thread = threading.Thread(
            target=self._run, name=f"perseus-freq-gpu{gpu.index}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            latest = item
            taken = 1
            with contextlib.suppress(queue.Empty):
                while latest is not None:
                    latest = self._queue.get_nowait()
                    taken += 1
            if latest is not None:
                try:
                    self.gpu.lock_sm_clocks(latest, latest)
                except BaseException as exc:  # re-raised in the training thread
                    with self._cond:
                        self._error = exc
            with self._cond:
                self._applied += taken
                self._cond.notify_all()
            if latest is None:
                return

    def _raise_pending(self) -> None:
        if self._error is None:
            return  # fast path; the worker sets it under the lock, and we re-check under it
        with self._cond:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def request(self, freq_mhz: int) -> None:
        """Ask for `freq_mhz` to be locked (no-op if it was the last one requested)."""
        self._raise_pending()
        if self._closed:
            raise RankError("The frequency controller is closed")
        if freq_mhz == self._last_requested_mhz:
            return
        self._last_requested_mhz = freq_mhz
        if self.inline:
            self.gpu.lock_sm_clocks(freq_mhz, freq_mhz)
            return
        with self._cond:
            self._requested += 1
        self._queue.put(freq_mhz)

    def wait_applied(self, timeout_s: float = 5.0) -> None:
        """Block until every request so far has been applied (used by the emulator only)."""
        if self._applied >= self._requested and self._error is None:
            return  # fast path: nothing in flight (both counters only grow)
        with self._cond:
            target = self._requested
            if not self._cond.wait_for(lambda: self._applied >= target, timeout=timeout_s):
                raise RankError(
                    f"GPU {self.gpu.index}: a clock change did not complete within {timeout_s} s"
                )
        self._raise_pending()

    def close(self) -> None:
        """Stop the worker and reset the GPU's SM clocks (always, even after an error)."""
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            with self._cond:
                self._requested += 1
            self._queue.put(None)
            self._thread.join(timeout=10.0)
        try:
            if self._last_requested_mhz is not None:  # we may have changed the clock
                self.gpu.reset_sm_clocks()
        finally:
            self._raise_pending()
