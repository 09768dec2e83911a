"""P2P hop latency: what the instruction DAG leaves out, calibrated from measurements.

The solver's DAG passes an activation or gradient from one pipeline rank to the next in
zero time. On a real job every such hop costs something (NCCL or gloo send/recv, a kernel
launch, a process waking up). The frontier is solved without it, which is right for its
energy accounting, but a plan that uses all of a stage's slack in the model makes more paths
critical, and every hop on them then adds to the measured iteration time: on the emulator
(4 ranks on 2 shared cores, gloo), a plan predicted at +0.7 % ran 2-3 % slower than all-max,
which a model with a 2 ms hop latency predicts (+2.2 %).

Here the hop latency ``L`` is a constant added to every edge between two pipeline ranks.
`calibrate_hop_latency` finds the ``L`` that makes the model's all-max iteration time equal
the measured one (every unmodelled second is charged to the hops), and `hop_times` scores
many plans under it at once. They explain a measured slowdown (the end-to-end test checks
the deployed plan against them); the solver does not use them yet: choosing among frontier
points solved without hops leaves only all-max once ``L`` is a few ms, so the latency has to
enter the solver's DAG itself (docs/hop-latency.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from perseus.errors import SolverError
from perseus.planning.problem import PipelineProblem

__all__ = ["calibrate_hop_latency", "hop_times"]

_BISECTIONS = 60


def _cross_preds(pp: PipelineProblem) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per node (topological index): its predecessors' indices, and 1.0 for each edge that
    crosses from one pipeline rank to another (0.0 within a rank)."""
    index = {ins: k for k, ins in enumerate(pp.instructions)}
    preds: list[list[int]] = [[] for _ in pp.instructions]
    cross: list[list[bool]] = [[] for _ in pp.instructions]
    for u, v in pp.schedule.dag().edges():
        preds[index[v]].append(index[u])
        cross[index[v]].append(u.rank != v.rank)
    return [
        (np.array(p, dtype=np.int64), np.array(c, dtype=float))
        for p, c in zip(preds, cross, strict=True)
    ]


class _HopModel:
    """The durations of some plans and the DAG's cross-rank edges, laid out once, so that
    many latencies can be tried (the calibration's bisection) without redoing either."""

    def __init__(self, pp: PipelineProblem, plans: Sequence[Sequence[Sequence[int]]]) -> None:
        choice = np.stack([pp.choice_of([list(f) for f in plan]) for plan in plans], axis=1)
        self.durations, _ = pp.solver.choices_to_arrays(choice)
        self.preds = _cross_preds(pp)

    def times(self, hop_latency_s: float) -> np.ndarray:
        """Each plan's longest path with `hop_latency_s` on every cross-rank edge."""
        finish = np.zeros_like(self.durations)
        for v, (pred, cross) in enumerate(self.preds):
            start = (
                (finish[pred] + (hop_latency_s * cross)[:, None]).max(axis=0) if len(pred) else 0
            )
            finish[v] = start + self.durations[v]
        return finish.max(axis=0)


def hop_times(
    pp: PipelineProblem, plans: Sequence[Sequence[Sequence[int]]], hop_latency_s: float
) -> np.ndarray:
    """Iteration time of each plan (per-stage frequency lists) when every edge between two
    pipeline ranks takes `hop_latency_s`; shape ``(len(plans),)``."""
    if not (math.isfinite(hop_latency_s) and hop_latency_s >= 0):
        raise SolverError(
            f"hop latency must be a finite number of seconds >= 0, got {hop_latency_s!r}"
        )
    if not plans:
        return np.zeros(0)
    return _HopModel(pp, plans).times(hop_latency_s)


def calibrate_hop_latency(
    pp: PipelineProblem, frequencies: Sequence[Sequence[int]], measured_s: float
) -> float:
    """The hop latency (s) at which the model's time for `frequencies` equals `measured_s`.

    0 when the model is already as slow as the measurement or the pipeline has one rank
    (no hops). The time is a maximum of lines in the latency (one per path, slope = its
    hops), so it never decreases: a bisection finds the latency to well under a microsecond.
    """
    if not (math.isfinite(measured_s) and measured_s > 0):
        raise SolverError(f"measured iteration time must be a positive number, got {measured_s!r}")
    model = _HopModel(pp, [frequencies])
    modelled = float(model.times(0.0)[0])
    if measured_s <= modelled or len(pp.stage_index) < 2:
        return 0.0
    # Some path has a hop, but the critical one need not: widen until the bound is reached.
    hi = measured_s - modelled
    while float(model.times(hi)[0]) < measured_s:
        hi *= 2
    lo = 0.0
    for _ in range(_BISECTIONS):
        mid = (lo + hi) / 2
        if float(model.times(mid)[0]) < measured_s:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
