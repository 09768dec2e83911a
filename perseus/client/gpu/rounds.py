"""What a rank measured in one round, and the trace lines it writes on the way.

A `RoundRecord` is filled by the hook's timing (`perseus.client.gpu.timing`): per step its
time and energy, per instruction kind and step the times and energies of its instructions,
and every instruction's host-clock interval (what the energy windows are cut from). At
the round's end it becomes the `ProfilingResult` the rank reports.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

from perseus.protocol import INSTRUCTIONS, EnergyWindow, ProfilingResult

__all__ = ["RoundRecord", "TraceWriter", "idle_before_s"]

TraceWriter = Callable[[dict[str, Any]], None]
"""Appends one record to the rank's trace (or drops it when there is none)."""


class RoundRecord:
    """The measurements of round `round_` so far (see the module docstring)."""

    def __init__(self, round_: int, write_trace: TraceWriter) -> None:
        self.round = round_
        self._write = write_trace
        self.iter_time: list[float] = []
        self.iter_energy: list[float] = []
        self.time_breakdown: dict[str, list[list[float]]] = {name: [] for name in INSTRUCTIONS}
        self.energy_breakdown: dict[str, list[list[float]]] = {name: [] for name in INSTRUCTIONS}
        self.intervals: list[tuple[int, float, float]] = []
        """The round's instructions so far: (index in the iteration, start, end), host clock."""
        self.start_s = 0.0
        """When the round's first step began (host clock)."""
        self.end_s = 0.0
        """When its last step ended (host clock)."""

    def start_step(self) -> None:
        """A step begins: every instruction kind gets an empty list for it."""
        for name in INSTRUCTIONS:
            self.time_breakdown[name].append([])
            self.energy_breakdown[name].append([])

    def drop_step(self) -> None:
        """Forget the step in progress (the training step failed). Its instructions stay
        in `intervals`: the GPU ran them, and the energy windows must see them."""
        for name in INSTRUCTIONS:
            self.time_breakdown[name].pop()
            self.energy_breakdown[name].pop()

    def instruction(
        self, name: str, time_s: float, energy_j: float, *, slot: int | None = None
    ) -> None:
        """One instruction of kind `name` of step `slot` (default: the current one)."""
        index = -1 if slot is None else slot
        self.time_breakdown[name][index].append(time_s)
        self.energy_breakdown[name][index].append(energy_j)

    def interval(self, index: int, start_s: float, end_s: float) -> None:
        """Instruction `index` of its iteration ran from `start_s` to `end_s` (host clock)."""
        self.intervals.append((index, start_s, end_s))

    def trace_instruction(
        self,
        *,
        step: int,
        index: int,
        name: str,
        stage: int | None,
        microbatch: int | None,
        freq_mhz: int,
        time_s: float,
        compute_s: float = -1.0,
    ) -> None:
        """The instruction's trace line (``compute_s``: emulation only)."""
        record: dict[str, Any] = {
            "kind": "instruction",
            "round": self.round,
            "step": step,
            "index": index,
            "instruction": name,
            "stage": stage,
            "microbatch": microbatch,
            "freq_mhz": freq_mhz,
            "time_s": time_s,
        }
        if compute_s >= 0:
            record["compute_s"] = compute_s
        self._write(record)

    def step(self, step: int, iter_time_s: float, iter_energy_j: float) -> None:
        """Step `step` took `iter_time_s` and `iter_energy_j` (and its trace line)."""
        self.iter_time.append(iter_time_s)
        self.iter_energy.append(iter_energy_j)
        self._write(
            {
                "kind": "step",
                "round": self.round,
                "step": step,
                "iter_time_s": iter_time_s,
                "iter_energy_j": iter_energy_j,
            }
        )

    def spread(self, power_w: float) -> None:
        """Each step's energy (and its instructions'): the round's mean power between its
        first and last refresh × their time. A refreshing counter read at a step's ends
        lags each end by up to a period, which for steps of a few hundred ms is 0, one or
        two refreshes of energy; between refreshes it is exact. The trace keeps the reads."""
        self.iter_energy = [power_w * t for t in self.iter_time]
        self.energy_breakdown = {
            name: [[power_w * t for t in step] for step in steps]
            for name, steps in self.time_breakdown.items()
        }

    def reads(self) -> tuple[list[float], dict[str, list[list[float]]]]:
        """The step and instruction energies as measured so far (before any `spread`)."""
        return self.iter_energy, self.energy_breakdown

    def result(
        self,
        rank: int,
        windows: list[EnergyWindow] | None,
        *,
        energies: tuple[list[float], dict[str, list[list[float]]]] | None = None,
    ) -> ProfilingResult:
        """The round as the rank reports it (`energies`: these instead of the current
        step and instruction energies, e.g. `reads` taken before a `spread`)."""
        iter_energy, energy_breakdown = energies if energies is not None else self.reads()
        return ProfilingResult(
            rank=rank,
            iter_time=self.iter_time,
            iter_energy=iter_energy,
            time_breakdown=self.time_breakdown,
            energy_breakdown=energy_breakdown,
            energy_windows=windows,
            idle_before_s=self.idle_before_s(),
        )

    def idle_before_s(self) -> list[float] | None:
        """`idle_before_s` of the round's `intervals`."""
        return idle_before_s(self.intervals)


def idle_before_s(intervals: Sequence[tuple[int, float, float]]) -> list[float] | None:
    """Per instruction index, the mean seconds the GPU was idle before it started (since the
    instruction before it ended), over `intervals` ((index, start, end) of every instruction
    run); None before two instructions ran. An index that never followed another gets 0."""
    runs = sorted(intervals, key=lambda run: run[1])
    if len(runs) < 2:
        return None
    size = 1 + max(index for index, _, _ in runs)
    total, count = [0.0] * size, [0] * size
    for (_, _, end), (index, start, _) in itertools.pairwise(runs):
        total[index] += max(0.0, start - end)
        count[index] += 1
    return [t / c if c else 0.0 for t, c in zip(total, count, strict=True)]
