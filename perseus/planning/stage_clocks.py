"""Plans that change no clock: every instruction of a stage at one clock.

The solver plans as if clock changes were free, and `perseus.planning.frontier` repairs and
re-scores its points with the switching latency afterwards. When a change costs about as
much as an instruction (15 ms switches, 10–30 ms instructions), nearly every solver plan
pays for its changes in time, and a plan that just runs each stage with slack at one lower
clock (no change at all, so nothing to pay) can beat them all near the fast end: on
README's example job (layers 2,4,3,1, 4 microbatches, 8 ms per layer) the frontier's first
point after all-max was +1.7 % while the last stage at 1200 MHz costs no time and saves
1.7 %.

`stage_clock_plans` walks a chain of such plans from all-max: each step lowers one stage to
its next cheaper clock, the step that saves the most energy per second of iteration time
added (steps that add no time first). A stage's clocks are those profiled for all of its
instruction kinds, and only the ones whose net energy (compute energy minus the blocking
energy its longer busy time saves, ``Σ eᵢ − P_block·Σ tᵢ``) falls as the clock falls are
steps. The frontier adds the chain's plans to its candidates; since none changes a clock,
their exact scores need no switching walk.
"""

from __future__ import annotations

import numpy as np

from perseus.planning.problem import PipelineProblem

__all__ = ["stage_clock_plans"]


def _stage_steps(problem: PipelineProblem, stage: int) -> list[np.ndarray]:
    """Option indices of `stage`'s nodes at each step of its clock ladder, max clock first."""
    pb = problem.solver
    idx = problem.stage_index[stage]
    if not len(idx):
        return []
    types = pb.type_of[idx]
    common = set.intersection(*(set(pb.type_options[t].label.tolist()) for t in set(types)))
    ladder: list[np.ndarray] = []
    best = np.inf
    for clock in sorted(common, reverse=True):
        # The first option with this label (as `PipelineProblem.choice_of` picks).
        choice = np.array(
            [int(np.flatnonzero(pb.type_options[t].label == clock)[0]) for t in types],
            dtype=np.int64,
        )
        net = float(
            pb.opt_energy[types, choice].sum() - pb.p2p_power_w * pb.opt_time[types, choice].sum()
        )
        if not ladder or net < best:
            ladder.append(choice)
            best = net
    return ladder


def stage_clock_plans(
    problem: PipelineProblem, *, max_time_s: float, max_points: int = 500
) -> np.ndarray:
    """Option indices ``(n, K)`` of the chain's plans, fastest first (all-max left out).

    The chain stops where no step saves energy, where the iteration time would pass
    `max_time_s`, or after `max_points` plans.
    """
    pb = problem.solver
    ladders = [_stage_steps(problem, s) for s in range(len(problem.stage_index))]
    pos = [0] * len(ladders)
    current = pb.reference_choice().copy()
    for s, ladder in enumerate(ladders):
        if ladder:
            current[problem.stage_index[s]] = ladder[0]
    t0, e0, _, _ = pb.account(current[:, None], exact=False)
    t_cur, e_cur = float(t0[0]), float(e0[0])
    plans: list[np.ndarray] = []
    while len(plans) < max_points:
        stages = [s for s, ladder in enumerate(ladders) if pos[s] + 1 < len(ladder)]
        if not stages:
            break
        cand = np.repeat(current[:, None], len(stages), axis=1)
        for k, s in enumerate(stages):
            cand[problem.stage_index[s], k] = ladders[s][pos[s] + 1]
        times, energies, _, _ = pb.account(cand, exact=False)
        saving = e_cur - energies
        added = np.maximum(times - t_cur, 0.0)
        ok = (saving > 0) & (times <= max_time_s)
        if not ok.any():
            break
        # Most energy saved per second added; among steps that add no time, the largest saving.
        ratio = np.where(ok, added / np.where(ok, saving, 1.0), np.inf)
        best = np.flatnonzero(ratio == ratio.min())
        k = int(best[np.argmax(saving[best])])
        s = stages[k]
        pos[s] += 1
        current = cand[:, k].copy()
        t_cur, e_cur = float(times[k]), float(energies[k])
        plans.append(current)
    if not plans:
        return np.empty((pb.n, 0), dtype=np.int64)
    return np.stack(plans, axis=1)
