"""P2P hop latency: calibrated from a measured iteration, scored by the solver's own DAG.

The instruction DAG passes an activation or gradient from one pipeline rank to the next; on
a real job every such hop costs something (NCCL or gloo send/recv, a kernel launch, a
process waking up). `PipelineProblem(..., hop_latency_s=L)` puts ``L`` on every edge between
two pipeline ranks as an edge lag of the solver's DAG, so the LP, the rounding, the exact
scoring and the polish all plan for it (`perseus.solver.problem`); `solve_frontier`,
`evaluate` and `make_plan` take it as `hop_latency_s=`.

`calibrate_hop_latency` finds the ``L`` that makes the model's iteration time of a plan
(the all-max plan of the profiling rounds) equal the measured one: every unmodelled second
is charged to the hops. `hop_times` scores many plans at one latency. Both use the solver's
lagged scoring (`SolverProblem.score`, or `perseus.planning.switching` when clock changes
take time), so a calibrated latency scores plans exactly as the frontier's points are
scored.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from perseus.errors import SolverError
from perseus.planning.problem import MAX_HOP_LATENCY_S, PipelineProblem, check_hop_latency

__all__ = ["calibrate_hop_latency", "hop_times"]

_BISECTIONS = 60


def _check_switch_latency(switch_latency_s: float) -> None:
    if not (math.isfinite(switch_latency_s) and 0 <= switch_latency_s <= 10):
        raise SolverError(f"switch_latency_s must be between 0 and 10 s, got {switch_latency_s!r}")


def _times(
    pp: PipelineProblem,
    plans: Sequence[Sequence[Sequence[int]]],
    hop_latency_s: float,
    switch_latency_s: float,
) -> np.ndarray:
    """Iteration time of each plan at `hop_latency_s` (the solver's lagged scoring)."""
    lagged = pp.with_hop_latency(hop_latency_s)
    if switch_latency_s > 0:
        return np.array(
            [
                lagged.evaluate(
                    [list(f) for f in plan], switch_latency_s=switch_latency_s
                ).iteration_time_s
                for plan in plans
            ]
        )
    choice = np.stack([pp.choice_of([list(f) for f in plan]) for plan in plans], axis=1)
    return lagged.solver.score(choice)[0]


def hop_times(
    pp: PipelineProblem,
    plans: Sequence[Sequence[Sequence[int]]],
    hop_latency_s: float,
    *,
    switch_latency_s: float = 0.0,
) -> np.ndarray:
    """Iteration time of each plan (per-stage frequency lists) when every edge between two
    pipeline ranks takes `hop_latency_s` (whatever `pp`'s own hop latency) and every clock
    change `switch_latency_s`; shape ``(len(plans),)``."""
    check_hop_latency(hop_latency_s)
    _check_switch_latency(switch_latency_s)
    if not plans:
        return np.zeros(0)
    return _times(pp, plans, hop_latency_s, switch_latency_s)


def calibrate_hop_latency(
    pp: PipelineProblem,
    frequencies: Sequence[Sequence[int]],
    measured_s: float,
    *,
    switch_latency_s: float = 0.0,
) -> float:
    """The hop latency (s) at which the model's time for `frequencies` equals `measured_s`.

    The plan is scored as plans are (`hop_times`), its clock changes taking
    `switch_latency_s`. 0 when the model is already as slow as the measurement or the
    pipeline has one rank (no hops). The time is a maximum of lines in the latency (one per
    path, slope = its hops), so it never decreases: a bisection finds the latency to well
    under a microsecond. Raises `SolverError` when no latency up to `MAX_HOP_LATENCY_S`
    explains the measurement (a profile far off the job it was measured on).
    """
    if not (math.isfinite(measured_s) and measured_s > 0):
        raise SolverError(f"measured iteration time must be a positive number, got {measured_s!r}")
    _check_switch_latency(switch_latency_s)
    plans = [frequencies]

    def model(hop_latency_s: float) -> float:
        return float(_times(pp, plans, hop_latency_s, switch_latency_s)[0])

    modelled = model(0.0)
    if measured_s <= modelled or len(pp.stage_index) < 2:
        return 0.0
    # Some path has a hop, but the critical one need not: widen until the bound is reached.
    hi = min(measured_s - modelled, MAX_HOP_LATENCY_S)
    while model(hi) < measured_s:
        if hi >= MAX_HOP_LATENCY_S:
            raise SolverError(
                f"The measured iteration time {measured_s:.6f} s is {measured_s - modelled:.6f} s "
                f"above the model's {modelled:.6f} s: no hop latency up to "
                f"{MAX_HOP_LATENCY_S:g} s explains it; the profile does not describe this job"
            )
        hi = min(2 * hi, MAX_HOP_LATENCY_S)
    lo = 0.0
    for _ in range(_BISECTIONS):
        mid = (lo + hi) / 2
        if model(mid) < measured_s:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
