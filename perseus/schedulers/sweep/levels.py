"""Which clocks the sweep measures, and how long its rounds are.

`coarse_levels`: the coarse pass's levels; `refine_levels`: the skipped levels REFINE
measures next to the bends of an instruction's time–energy hull; `counter_round_steps`:
the iterations a round needs to hold enough refreshes of the GPUs' energy counters.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from perseus.protocol import MAX_ITERATIONS

__all__ = [
    "MIN_ROUND_S",
    "coarse_levels",
    "counter_round_steps",
    "refine_levels",
    "sweep_round_steps",
]

MIN_ROUND_S = 0.5
"""The shortest sweep round on a continuous counter (ideal emulated sensors): its windows
are exact, but the fit needs a few of them per round."""


def counter_round_steps(
    refresh_s: Sequence[float | None], iteration_s: float | None, round_ticks: int
) -> int | None:
    """Iterations a round needs to hold `round_ticks` refreshes of the slowest of the
    ranks' energy counters (`RankInfo.energy_refresh_s`), at the last measured iteration
    time; None (the ranks' own rounds) when a counter's period is unknown, every counter is
    continuous, or no iteration was measured yet."""
    if iteration_s is None or not refresh_s or any(r is None for r in refresh_s):
        return None
    slowest = max(r for r in refresh_s if r is not None)
    if slowest <= 0:
        return None
    # Two more refreshes than asked: the partial periods at both ends are not windows.
    steps = math.ceil((round_ticks + 2) * slowest / max(iteration_s, 1e-6) - 1e-9)
    return max(1, min(steps, MAX_ITERATIONS))


def sweep_round_steps(
    refresh_s: Sequence[float | None], iteration_s: float | None, round_ticks: int
) -> int | None:
    """Iterations a sweep round needs: `counter_round_steps`, but on continuous counters
    (every refresh period 0) enough iterations for `MIN_ROUND_S`: any round has exact
    windows there, but the fit needs a few."""
    slowest = max((r for r in refresh_s if r is not None), default=0.0)
    if slowest == 0 and iteration_s is not None:
        return max(1, min(math.ceil(MIN_ROUND_S / max(iteration_s, 1e-6)), MAX_ITERATIONS))
    return counter_round_steps(refresh_s, iteration_s, round_ticks)


def coarse_levels(levels: Sequence[int], step: int) -> list[int]:
    """Every `step`-th of `levels` (descending) from the top. The few below the last one are
    left to REFINE, which bisects them only if the instruction is cheapest there."""
    return list(levels[::step])


def _lower_hull(points: list[tuple[float, float, int]]) -> list[tuple[float, float, int]]:
    """The Pareto set's lower convex hull: (time, energy, freq), fastest first."""
    pareto: list[tuple[float, float, int]] = []
    for p in sorted(points):
        if not pareto or p[1] < pareto[-1][1]:
            pareto.append(p)
    hull: list[tuple[float, float, int]] = []
    for p in pareto:
        while len(hull) >= 2:
            (t0, e0, _), (t1, e1, _) = hull[-2], hull[-1]
            if (t1 - t0) * (p[1] - e0) - (e1 - e0) * (p[0] - t0) > 0:
                break
            hull.pop()
        hull.append(p)
    return hull


def refine_levels(
    measured: Mapping[int, tuple[float, float]], levels: Sequence[int], tolerance: float
) -> list[int]:
    """The next levels worth measuring for one instruction, descending ([]: done).

    `measured`: frequency → (time s, energy J) so far; `levels`: every level the sweep may
    run. The solver plans with an instruction's Pareto options; along a straight stretch of
    their lower convex hull a skipped level can only add a point near the line, so skipped
    levels are measured only next to the hull vertices that matter, by bisection: the
    middle skipped level between such a vertex and each of its measured neighbours (in
    frequency). The vertices: the fastest (the critical path runs it) and the cheapest
    (slack is filled down to it), until their neighbours are adjacent levels, and every
    other vertex whose energy lies more than ``4·tolerance`` (relative) below the chord of
    its hull neighbours: a curve bending that much over two gaps may lie about
    `tolerance` below the chord inside each gap (a parabola's sag over one gap is a quarter
    of its sag over two). Call again with the new points until it returns [].
    """
    if len(measured) < 2:
        return []
    hull = _lower_hull([(t, e, f) for f, (t, e) in measured.items()])
    chosen = {hull[0][2], hull[-1][2]}
    for (t0, e0, _), (t, e, f), (t1, e1, _) in zip(hull, hull[1:], hull[2:], strict=False):
        chord = e0 + (e1 - e0) * (t - t0) / (t1 - t0)
        if chord - e > 4.0 * tolerance * e:
            chosen.add(f)
    freqs = sorted(measured, reverse=True)
    out: set[int] = set()
    cheapest = hull[-1][2]
    for f in chosen:
        k = freqs.index(f)
        higher = freqs[k - 1] if k > 0 else f
        # Below the lowest point measured only when it is the cheapest: the coarse pass
        # ended there without seeing the energy rise.
        lower = freqs[k + 1] if k + 1 < len(freqs) else (0 if f == cheapest else f)
        for lo, hi in ((f, higher), (lower, f)):
            skipped = [lv for lv in levels if lo < lv < hi]
            if skipped:
                out.add(skipped[len(skipped) // 2])
    return sorted(out, reverse=True)
