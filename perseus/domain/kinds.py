"""The domain's names and constants, importable without numpy: instruction kinds, profile
columns, schedule names, the default blocking power."""

from __future__ import annotations

__all__ = ["DEFAULT_P2P_POWER_W", "INSTRUCTIONS", "PROFILE_COLUMNS", "SCHEDULES"]

INSTRUCTIONS = ("forward", "backward")
"""The instruction kinds a profile holds and a schedule orders, in profile order."""

PROFILE_COLUMNS = ("stage", "instruction", "frequency", "time", "energy")
"""A profile table's columns, in order: one row per stage, instruction and frequency (time in
s, energy in J). The short CSV form is this table."""

SCHEDULES = ("1f1b", "gpipe", "interleaved")
"""The built-in pipeline schedules (`perseus.domain.schedule.make_schedule`)."""

DEFAULT_P2P_POWER_W = 70.38
"""Power (W) a GPU draws while blocked on P2P communication, when nothing better is known:
the A40 measurement published with Perseus. `perseus solve` defaults to it, and the online
schedulers fall back to it when no rank ever had idle time to measure it."""
