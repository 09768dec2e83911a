"""The one rule that picks a plan from a frontier: the cheapest within a time bound."""

from __future__ import annotations

import math
from collections.abc import Sequence

from perseus.domain.units import max_slowdown_problem
from perseus.errors import SolverError

__all__ = ["choose_index"]

_TIME_RTOL = 1e-9


def choose_index(
    times_s: Sequence[float],
    energies_j: Sequence[float],
    *,
    max_slowdown: float | None = None,
    deadline_s: float | None = None,
    reference_s: float | None = None,
) -> int:
    """Index of the minimum-energy point with ``T ≤ (1 + max_slowdown)·T_ref`` or ``T ≤ deadline_s``.

    The one choice rule, used by `Frontier.choose` and by `perseus choose` (which reads only
    ``frontier.csv`` and the reference's time). ``T_ref`` is `reference_s`, the all-max
    plan's time (default: the fastest point's, as in frontiers cut off at all-max). Points
    are fastest first; ties in energy go to the faster point.
    """
    if (max_slowdown is None) == (deadline_s is None):
        raise SolverError("Pass exactly one of max_slowdown= or deadline_s= to choose a plan")
    if not times_s:
        raise SolverError("The frontier has no points")
    fastest = times_s[0]
    if reference_s is not None and not (math.isfinite(reference_s) and reference_s > 0):
        raise SolverError(f"reference_s must be a positive number of seconds, got {reference_s!r}")
    if deadline_s is not None:
        if not math.isfinite(deadline_s):
            raise SolverError(f"deadline_s must be a finite number of seconds, got {deadline_s!r}")
        limit = deadline_s
    elif max_slowdown is not None:
        problem = max_slowdown_problem(max_slowdown)
        if problem:
            raise SolverError(problem)
        limit = (fastest if reference_s is None else reference_s) * (1 + max_slowdown)
    fits = [k for k, t in enumerate(times_s) if t <= limit * (1 + _TIME_RTOL)]
    if not fits:
        raise SolverError(
            f"No plan meets an iteration time of {limit:.6f} s: the fastest plan takes "
            f"{fastest:.6f} s; relax the deadline"
        )
    return min(fits, key=lambda k: energies_j[k])
