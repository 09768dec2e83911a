"""The domain's names and constants, importable without numpy: instruction kinds, profile
columns, schedule names, the default blocking power."""

from __future__ import annotations

__all__ = [
    "BACKWARD_SPLIT",
    "DEFAULT_P2P_POWER_W",
    "INSTRUCTIONS",
    "MAX_PLAUSIBLE_POWER_W",
    "MAX_SLOWDOWN_LIMIT",
    "MIN_PLAUSIBLE_POWER_W",
    "PROFILE_COLUMNS",
    "SCHEDULES",
]

INSTRUCTIONS = ("forward", "backward", "backward_input", "backward_weight")
"""The instruction kinds a profile holds and a schedule orders, in profile order: the
forward, the full backward, and the two halves of a split backward (input gradient, weight
gradient) that zero-bubble schedules run."""

BACKWARD_SPLIT = ("backward_input", "backward_weight")
"""The kinds a split backward is made of."""

PROFILE_COLUMNS = ("stage", "instruction", "frequency", "time", "energy")
"""A profile table's columns, in order: one row per stage, instruction and frequency (time in
s, energy in J). The short CSV form is this table."""

SCHEDULES = ("1f1b", "gpipe", "interleaved", "zb")
"""The built-in pipeline schedules (`perseus.domain.schedule.make_schedule`)."""

DEFAULT_P2P_POWER_W = 70.38
"""Power (W) a GPU draws while blocked on P2P communication, when nothing better is known:
the A40 measurement published with Perseus. `perseus solve` defaults to it, and the online
schedulers fall back to it when no rank ever had idle time to measure it."""

MIN_PLAUSIBLE_POWER_W = 1.0
"""The least power (W) a profiled instruction may draw (energy / time) before the profile is
refused as a unit mistake: below it, times are likely in ms instead of s (power 1000× too
small). No GPU computes on less than a watt."""

MAX_PLAUSIBLE_POWER_W = 2000.0
"""The most power (W) one profile row (a GPU, or a tensor-parallel rank) may draw before the
profile is refused: above it, energies are likely in mJ instead of J (power 1000× too
large). The largest boards draw about 1 kW."""

MAX_SLOWDOWN_LIMIT = 1.0
"""The largest allowed slowdown fraction (1.0 = twice the time): above it a user likely
meant per cent (5 for 5 %) where a fraction (0.05) is asked for."""
