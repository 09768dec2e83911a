"""The protocol's bounds and measured-number types, checked where a value arrives."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

__all__ = [
    "MAX_ENERGY_J",
    "MAX_FREQUENCIES",
    "MAX_FREQ_MHZ",
    "MAX_ITERATIONS",
    "MAX_POWER_W",
    "MAX_REFRESH_S",
    "MAX_REPLICAS",
    "MAX_SWITCH_LATENCY_S",
    "MAX_TIME_S",
    "MAX_WINDOWS",
    "PROTOCOL_VERSION",
    "SAMPLED_TAIL",
    "AFTER_WORK_EDGES_S",
    "FreqMHz",
    "InstructionKind",
    "Joules",
    "Seconds",
    "Span",
]

InstructionKind = Literal["forward", "backward", "backward_input", "backward_weight"]

# Bounds of a measurement, checked where it arrives. Beyond them a number is a unit mistake
# or a broken meter, and a sum of a window's worth of them could overflow to inf (1e308
# each) or poison every mean (NaN): a measurement is finite, a time positive, an energy
# non-negative, each below a bound that keeps any sum the schedulers take finite.
MAX_TIME_S = 1e6
"""A time above 11.6 days (per iteration or per instruction) is a unit mistake."""
MAX_ENERGY_J = 1e10
"""An energy above 10 GJ (a 1 kW GPU for 116 days) is a unit mistake."""
MAX_ITERATIONS = 10_000
"""Iterations in one profiling window (one round's result)."""
MAX_FREQUENCIES = 1024
"""SM clocks one GPU reports (an A100 has 81, an H100 about 100): the most a rank may list in
`RankInfo.available_frequencies`, or a profile hold per instruction."""
MAX_FREQ_MHZ = 100_000
MAX_WINDOWS = 2_000
"""Energy windows in one round's result (`ProfilingResult.energy_windows`): 200 s of 100 ms
refreshes; a rank merges refreshes to stay within it."""
MAX_REFRESH_S = 60.0
"""The longest energy-counter refresh period a rank may report."""
SAMPLED_TAIL = 0.25
"""The share of each refresh period that A100 and H100 power sensors sample, at its end
(arXiv 2312.02741): windows carry their busy seconds in it (`EnergyWindow.tail_busy_s`)."""
AFTER_WORK_EDGES_S = (0.004, 0.016, 0.064)
"""A GPU's power does not fall to idle the moment its work stops: it decays over milliseconds
(the H200's gaps drew ~100 W where the H100 idles at 70 W; `docs/emulator.md`). Windows carry
the idle seconds within these edges after each instruction ends (`EnergyWindow.after_s`:
[0, 4 ms), [4, 16 ms), [16, 64 ms)), so the fit gives each band its own power."""
MAX_SWITCH_LATENCY_S = 10.0
"""A clock switch measured longer than this is a broken measurement."""
MAX_REPLICAS = 65_536
"""Data-parallel replicas one leader may speak for (a job's dp_degree at most)."""
MAX_POWER_W = 100_000.0
"""A power above 100 kW for one GPU is a unit mistake."""

PROTOCOL_VERSION = 2
"""The newest protocol this package speaks. 1: every rank registers, reports and asks for
its schedule (Zeus's protocol). 2: only the job's leaders do (`JobInfo.leaders_per_stage`,
`perseus.domain.layout.Leaders`); each speaks for its group, whose ranks get their schedule
from it over the job's own process group."""

Seconds = Annotated[float, Field(gt=0.0, le=MAX_TIME_S, allow_inf_nan=False)]
"""A measured time: finite, > 0, at most `MAX_TIME_S`."""
Joules = Annotated[float, Field(ge=0.0, le=MAX_ENERGY_J, allow_inf_nan=False)]
"""A measured energy: finite, >= 0, at most `MAX_ENERGY_J`."""
FreqMHz = Annotated[int, Field(gt=0, le=MAX_FREQ_MHZ)]
"""An SM clock in MHz."""
Span = Annotated[float, Field(ge=0.0, le=MAX_TIME_S, allow_inf_nan=False)]
"""A part of a time: finite, >= 0."""
