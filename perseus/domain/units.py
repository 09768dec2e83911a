"""Unit sanity of user-given numbers: a slowdown is a fraction, a blocking power is a GPU's.

Each check returns the problem as one sentence with the likely mistake (or None), so that
every edge (CLI option, scheduler argument, library call) raises its own error type with the
same words.
"""

from __future__ import annotations

import math

from perseus.domain.kinds import MAX_SLOWDOWN_LIMIT

__all__ = ["blocking_power_problem", "max_slowdown_problem"]


def max_slowdown_problem(value: float, *, name: str = "max_slowdown") -> str | None:
    """Why `value` is not a slowdown fraction in [0, `MAX_SLOWDOWN_LIMIT`], or None."""
    if not (math.isfinite(value) and value >= 0):
        return f"{name} must be a finite fraction >= 0 (0.05 = 5 % slower), got {value!r}"
    if value > MAX_SLOWDOWN_LIMIT:
        return (
            f"{name} {value:g} is above {MAX_SLOWDOWN_LIMIT:g}: it is a fraction, so "
            f"{value:g} means {100 * value:g} % slower; for {value:g} % pass {value / 100:g}"
        )
    return None


def blocking_power_problem(
    value: float, low_w: float, high_w: float, *, gpu: str, name: str = "p2p_power"
) -> str | None:
    """Why `value` (W) is not a blocking power within `gpu`'s range [`low_w`, `high_w`], or None."""
    if not (math.isfinite(value) and low_w <= value <= high_w):
        return (
            f"{name} {value:g} W is outside {gpu}'s power range {low_w:g}..{high_w:g} W: "
            "the blocking power is the watts one GPU (times the tensor-parallel degree) "
            "draws while waiting on P2P communication, typically 60..150 W; "
            "a value in mW or kW? (pass watts)"
        )
    return None
