"""Instruction timing without stalling the training thread: CUDA events and a watcher thread.

The mechanics of the hook's "events" timing (`perseus.client.gpu.timing.EventsTiming`). Sync
timing synchronises the device around every instruction, so that host clocks, the energy
counter and the clock changes line up with what the GPU runs. That stalls the host at
every instruction: the next instruction's kernels are only queued once the previous ones
finished, and launch overlap is lost.

`EventTimer` ("events" timing) queues a CUDA event before and after each instruction and
lets a watcher thread wait for them instead: when an instruction's start event completes
the GPU has reached it, so the watcher asks for its clock then. Times come from the events
themselves (`elapsed_time`, GPU timestamps). The training thread only records events and
synchronises once per iteration, at `drain`.

Energy is not read per instruction: on the H100 we measured (``docs/measurements/
h100-2026-11-24``) the energy counter and NVML's power readings refresh every 100 ms and
one counter read costs about 2.4 ms, so per-instruction reads of 2-20 ms instructions are
mostly zero or a whole 100 ms tick, and stall the loop. The watcher reads the counter when
the GPU reaches an iteration's start and end (off the training thread), and the hook gives
each instruction the iteration's energy in proportion to its time (the iteration's mean
power): `step_energies_j`, once per round.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from perseus.errors import RankError

__all__ = ["EventTimer", "InstructionTiming"]


@dataclass(frozen=True)
class InstructionTiming:
    """One instruction as the GPU ran it: seconds, and the clock asked for it."""

    name: str
    time_s: float
    freq_mhz: int
    stage: int | None
    microbatch: int | None
    offset_s: float = 0.0
    """GPU seconds from its iteration's start mark to its start."""


@dataclass
class _Mark:
    begin: bool
    event: Any  # torch.cuda.Event
    mj: float | None = None
    host_s: float = 0.0
    """`time.perf_counter` when the watcher saw the GPU reach the mark."""


@dataclass
class _Pending:
    name: str
    freq_mhz: int
    stage: int | None
    microbatch: int | None
    start: Any  # torch.cuda.Event
    end: Any = None


class EventTimer:
    """Times a rank's instructions with CUDA events (one watcher thread per rank).

    Args:
        device: The CUDA device (index) whose current stream runs the instructions.
        read_energy_mj: Reads the GPU's energy counter (millijoules), at iteration marks.
        request_clock: Asks for an SM clock (the frequency controller's `request`); called
            from the watcher thread when the GPU starts the instruction.
    """

    def __init__(
        self,
        device: int,
        read_energy_mj: Callable[[], float],
        request_clock: Callable[[int], None],
    ) -> None:
        import torch

        if not torch.cuda.is_available():
            raise RankError("events timing needs a CUDA GPU that torch can see")
        self._torch = torch
        self._device = device
        self._request_clock = request_clock
        self._read_energy_mj = read_energy_mj
        self._marks: list[_Mark] = []
        self._queue: queue.SimpleQueue[tuple[str, _Pending] | None] = queue.SimpleQueue()
        self._step: list[_Pending] = []
        self._open: _Pending | None = None
        self._handled = 0
        self._queued = 0
        self._step_mark: _Mark | None = None
        self.last_spans: list[tuple[float, float]] = []
        """Per iteration of the last `step_energies_j` call, (start, end) on the host clock:
        when the GPU reached its marks (the hook's instruction times hang off them)."""
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._watch, name=f"perseus-events-gpu{device}", daemon=True
        )
        self._thread.start()

    def _event(self) -> Any:
        event = self._torch.cuda.Event(enable_timing=True)
        event.record(self._torch.cuda.current_stream(self._device))
        return event

    def begin(self, name: str, freq_mhz: int, stage: int | None, microbatch: int | None) -> None:
        """Queue the start of an instruction (its clock is asked for when the GPU gets there)."""
        pending = _Pending(name, freq_mhz, stage, microbatch, start=self._event())
        self._open = pending
        self._put("start", pending)

    def end(self) -> None:
        """Queue the end of the instruction begun last."""
        pending, self._open = self._open, None
        if pending is None:
            raise RankError("EventTimer.end() without begin()")
        pending.end = self._event()  # read at step_end, once the GPU is done
        self._step.append(pending)

    def step_begin(self) -> None:
        """Mark an iteration's start (the watcher reads the counter when the GPU gets there)."""
        mark = _Mark(True, self._event())
        self._marks.append(mark)
        self._step_mark = mark
        self._put("mark", mark)

    def step_end(self) -> list[InstructionTiming]:
        """Mark an iteration's end, synchronise, and return its instructions' times."""
        mark = _Mark(False, self._event())
        self._marks.append(mark)
        self._put("mark", mark)
        self._torch.cuda.synchronize(self._device)
        done, self._step = self._step, []
        begin = self._step_mark
        return [
            InstructionTiming(
                name=p.name,
                time_s=p.start.elapsed_time(p.end) / 1000.0,
                freq_mhz=p.freq_mhz,
                stage=p.stage,
                microbatch=p.microbatch,
                offset_s=0.0 if begin is None else begin.event.elapsed_time(p.start) / 1000.0,
            )
            for p in done
        ]

    def step_energies_j(self, timeout_s: float = 60.0) -> list[float]:
        """Joules of each iteration marked since the last call (waits for the watcher)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._handled < self._queued:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RankError(f"GPU {self._device}: iteration marks not seen in time")
                self._cond.wait(left)
            error, self._error = self._error, None
        if error is not None:
            raise error
        marks, self._marks = self._marks, []
        energies = []
        self.last_spans = []
        for begin, end in zip(marks[::2], marks[1::2], strict=True):
            if not (begin.begin and not end.begin) or begin.mj is None or end.mj is None:
                raise RankError(
                    f"GPU {self._device}: an iteration's marks are out of order or unread "
                    "(every step_begin needs its step_end before the round ends)"
                )
            energies.append(max(0.0, (end.mj - begin.mj) / 1000.0))
            self.last_spans.append((begin.host_s, end.host_s))
        return energies

    def _put(self, what: str, pending: Any) -> None:
        with self._cond:
            self._queued += 1
        self._queue.put((what, pending))

    def _watch(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            what, pending = item
            try:
                if what == "mark":
                    pending.event.synchronize()  # releases the GIL while it waits
                    pending.host_s = time.perf_counter()
                    pending.mj = self._read_energy_mj()
                else:  # an instruction's start: the GPU got there, so its clock now
                    pending.start.synchronize()
                    self._request_clock(pending.freq_mhz)
            except BaseException as exc:  # re-raised on the training thread at drain()
                with self._cond:
                    self._error = exc
            with self._cond:
                self._handled += 1
                self._cond.notify_all()

    def discard(self) -> None:
        """Forget the step in progress (the training step failed)."""
        self._open = None
        self._step = []
        if self._marks and self._marks[-1].begin:
            self._marks.pop()
            self._step_mark = None

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5.0)
