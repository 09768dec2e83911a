"""The domain's names and constants, importable without numpy: instruction kinds, profile
columns, schedule names, the default blocking power."""

from __future__ import annotations

__all__ = ["BACKWARD_SPLIT", "DEFAULT_P2P_POWER_W", "INSTRUCTIONS", "PROFILE_COLUMNS", "SCHEDULES"]

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
