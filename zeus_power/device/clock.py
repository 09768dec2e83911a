"""`VirtualClock`: a time source that moves only when told to, for running in virtual time."""

from __future__ import annotations

import math
import threading

from zeus_power.device.base import GPUValueError

__all__ = ["VirtualClock"]


class VirtualClock:
    """A clock that moves only when told to: pass it as `EmulatedGPU(clock=...)`.

    Calling it returns the current virtual time in seconds. `advance` (alias `sleep`) moves
    it forward; `EmulatedGPU.execute` advances it by the model time of the work.
    """

    def __init__(self, start_s: float = 0.0) -> None:
        if not math.isfinite(start_s):
            raise GPUValueError(f"start_s={start_s!r} must be finite")
        self._now_s = float(start_s)
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return self._now_s

    @property
    def now_s(self) -> float:
        """Current virtual time in seconds."""
        return self._now_s

    def advance(self, seconds: float) -> float:
        """Move forward by `seconds` (>= 0) and return the new time."""
        if not (math.isfinite(seconds) and seconds >= 0):
            raise GPUValueError(f"A VirtualClock only moves forward; got seconds={seconds!r}")
        with self._lock:
            self._now_s += float(seconds)
            return self._now_s

    sleep = advance

    def __repr__(self) -> str:
        return f"VirtualClock(now_s={self._now_s!r})"
