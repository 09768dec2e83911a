"""Clock switching in the plan: what a change of SM clock costs, and plans that pay for it.

Setting a locked clock takes time on a real GPU (10–20 ms for `nvmlDeviceSetGpuLockedClocks`,
docs/emulator.md), and the hook asks for each instruction's clock when the instruction
begins. So an instruction whose clock differs from the one in force runs its first ``L``
seconds (the switching latency) at the old clock, and only the rest at its own; an
instruction shorter than that runs entirely at the old clock and the switch completes
during what follows. Upward changes thus cost time, downward ones cost energy.

`switching_accounting` is the exact accounting of that (the emulated GPU's
`ZEUS_EMULATED_SWITCH_LATENCY_MS` behaves the same way): it walks the DAG in topological
order (an instruction starts when its last input arrives: its predecessors' finish plus
the edge's lag, the P2P hop latency between ranks, so a plan's numbers count switches and
hops together), tracks each rank's clock in force and pending switch, and replaces every
instruction's profiled (time, energy) by its two-clock one; iteration time and energy then
follow as in `perseus.planning.problem` (``E = Σ eᵢ + P_block · (S·T − Σ tᵢ)``). Each rank
repeats its schedule, so an iteration starts with the clock (or the switch under way) that
the rank's last instructions left: the walk runs two iterations and reports the second.

`repair_frequencies` removes the changes that cannot be reached in time: a change down
into an instruction shorter than ``L`` would only land on a later one, so the instruction
keeps the (faster) clock in force. `perseus.planning.frontier.solve_frontier` repairs and
re-scores every frontier point this way and keeps the Pareto-optimal ones, so the plan
chosen for a slowdown budget meets it with its switches counted.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np

from perseus.domain.plan import Evaluation
from perseus.solver.problem import SolverProblem


class SwitchingProblem(Protocol):
    """What of `perseus.planning.problem.PipelineProblem` this module reads (the problem
    module calls this one: no import back)."""

    solver: SolverProblem
    stage_index: list[np.ndarray]
    p2p_power_w: float

    def choice_of(self, frequencies: list[list[int]]) -> np.ndarray: ...


__all__ = ["repair_frequencies", "switching_accounting"]


def _option(pp: SwitchingProblem, node: int, freq_mhz: int) -> tuple[float, float]:
    """(time, energy) of `node` at the profiled clock nearest `freq_mhz` (the clock
    in force may be one its kind was not profiled at)."""
    o = pp.solver.type_options[pp.solver.type_of[node]]
    k = int(np.argmin(np.abs(o.label.astype(np.int64) - int(freq_mhz))))
    return float(o.time_s[k]), float(o.energy_j[k])


def switching_durations(
    pp: SwitchingProblem, frequencies: list[list[int]], latency_s: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per node (topological order): start, duration and energy with switching latency."""
    pb = pp.solver
    choice = pp.choice_of(frequencies)
    time0, energy0 = pb.choices_to_arrays(choice)
    label = pb.choices_to_labels(choice)
    n = pb.n
    rank_of = np.empty(n, dtype=np.int64)
    for r, idx in enumerate(pp.stage_index):
        rank_of[idx] = r
    # Per rank: clock asked for last, clock in force before it, when it takes effect.
    target = [int(label[idx[-1]]) if len(idx) else 0 for idx in pp.stage_index]
    before = list(target)
    switch_at = [-math.inf] * len(pp.stage_index)
    preds = pb.preds
    pred_lag = pb.pred_lag  # None: no edge has a lag
    finish = np.zeros(n + 1)  # row n: the "no predecessor" zero
    start = np.zeros(n)
    dur = np.empty(n)
    energy = np.empty(n)
    # Two passes: the second iteration starts with the clocks the first left, a switch
    # asked for near its end possibly still under way (a latency longer than the last
    # instructions); the second is the steady state reported.
    for _ in range(2):
        for i in range(n):
            if pred_lag is None:
                s = float(finish[preds[i]].max())
            else:
                s = float((finish[preds[i]] + pred_lag[i]).max())
            r = int(rank_of[i])
            f = int(label[i])
            if f != target[r]:
                before[r] = before[r] if s < switch_at[r] else target[r]
                target[r] = f
                switch_at[r] = s + latency_s
            lag = switch_at[r] - s
            d, e = float(time0[i]), float(energy0[i])
            if lag > 0 and before[r] != f:
                t_old, e_old = _option(pp, i, before[r])
                if t_old <= lag:
                    d, e = t_old, e_old
                else:
                    left = 1.0 - lag / t_old
                    d, e = lag + left * d, e_old / t_old * lag + left * e
            start[i] = s
            dur[i] = d
            energy[i] = e
            finish[i] = s + d
        end = float(finish[:n].max()) if n else 0.0
        switch_at = [t - end for t in switch_at]
    return start, dur, energy


def switching_accounting(
    pp: SwitchingProblem, frequencies: list[list[int]], latency_s: float
) -> Evaluation:
    """The exact accounting of a plan whose clock changes take `latency_s` to apply.

    With ``latency_s == 0`` it equals `SwitchingProblem.evaluate` (up to rounding).
    """
    start, dur, energy = switching_durations(pp, frequencies, latency_s)
    T = float((start + dur).max()) if len(dur) else 0.0
    compute_e = math.fsum(energy)
    blocking = pp.p2p_power_w * (len(pp.stage_index) * T - math.fsum(dur))
    return Evaluation(T, compute_e + blocking, compute_e, blocking)


def repair_frequencies(
    pp: SwitchingProblem, frequencies: list[list[int]], latency_s: float, *, hoist: bool = True
) -> list[list[int]]:
    """`frequencies` with every change reachable in time.

    A change down into an instruction that lasts less than `latency_s` at the clock in
    force would complete only during a later instruction: the instruction keeps the clock
    in force instead (faster; the plan gives up a saving it could not have had). A change
    up is asked for early: the instructions before it, back to `latency_s` of their time,
    take the higher clock, so the instruction it was planned for starts at its clock
    (`hoist`; it costs the energy of those instructions' faster part, and cancels a dip of
    one short instruction altogether, so the frontier tries plans both ways).
    """
    if latency_s <= 0:
        return [list(f) for f in frequencies]
    out: list[list[int]] = []
    for idx, freqs in zip(pp.stage_index, frequencies, strict=True):
        fixed = [int(f) for f in freqs]
        cur = fixed[-1] if fixed else 0
        for k, node in enumerate(idx):
            f = fixed[k]
            o = pp.solver.type_options[pp.solver.type_of[int(node)]]
            if f < cur and cur in o.label and _option(pp, int(node), cur)[0] < latency_s:
                fixed[k] = cur
            cur = fixed[k]
        # A change up would run the instruction's first L at the lower clock, slower than
        # planned: ask for it earlier instead, from the instructions before (at most L of
        # them), which then run partly faster than planned, never slower.
        for k in range(1, len(fixed) if hoist else 0):
            want = fixed[k]
            need = latency_s
            j = k - 1
            while j >= 0 and need > 0 and fixed[j] < want:
                labels = pp.solver.type_options[pp.solver.type_of[int(idx[j])]].label
                if want not in labels:
                    break
                need -= _option(pp, int(idx[j]), fixed[j])[0]
                fixed[j] = want
                j -= 1
        out.append(fixed)
    return out
