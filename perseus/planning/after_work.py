"""What a GPU draws after its work stops, counted in a plan's energy.

A GPU's power does not fall to its blocking power the moment an instruction ends: the
energy-window fit (`perseus.schedulers.sweep.power_fit`) finds, per GPU, the share of the
last instruction's power above blocking that it still draws in each band of idle time after
the instruction (`AFTER_WORK_EDGES_S`: the first 4 ms, up to 16 ms, up to 64 ms). The
solver's accounting charges every idle second the blocking power; where a pipeline's bubbles
are short against the decay, that misses most of what they cost, and most of what a plan
saves there (a plan that lowers an instruction's clock lowers the power its GPU draws in the
bubble after it too). On the fidelity family's 1–5 ms jobs with 3–30 ms decays the plan's
saving as the GPUs drew it was 4–10 points above the saving predicted without it.

`after_work_energy_j` counts it for a plan: on the plan's timeline (every instruction at its
earliest start, `PipelineProblem.timeline`), every idle gap after an instruction on its
pipeline rank, the last one wrapping to the rank's first instruction of the next iteration,
draws ``share_k × (p − p_block)`` above blocking in band k, `p` the instruction's power.
The frontier is solved without it; a plan's predicted saving counts it
(`perseus.schedulers.perseus_scheduler.plan_model.PlanModel.predicted`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from perseus.protocol import AFTER_WORK_EDGES_S

if TYPE_CHECKING:
    from perseus.domain.plan import ScheduledInstruction
    from perseus.planning.problem import PipelineProblem

__all__ = ["AfterWork", "after_work_energy_j"]

_ROUNDING = 1e-9
"""How far off [0, 1] a share may be and still be one: a bounded least-squares fit returns
its bounds give or take rounding."""


@dataclass(frozen=True)
class AfterWork:
    """Per pipeline rank, the share of an instruction's power above blocking its GPU draws in
    each band of idle time after it (`AFTER_WORK_EDGES_S`), each in [0, 1]; a share off that
    range by no more than rounding (`_ROUNDING`: a bounded fit's −2e-19) is put on it."""

    shares: Mapping[int, Sequence[float]]

    def __post_init__(self) -> None:
        clipped: dict[int, list[float]] = {}
        for rank, shares in self.shares.items():
            if len(shares) > len(AFTER_WORK_EDGES_S) or not all(
                math.isfinite(s) and -_ROUNDING <= s <= 1.0 + _ROUNDING for s in shares
            ):
                raise ValueError(
                    f"pipeline rank {rank}: after-work shares must be at most "
                    f"{len(AFTER_WORK_EDGES_S)} numbers in [0, 1], got {list(shares)!r}"
                )
            clipped[rank] = [min(max(float(s), 0.0), 1.0) for s in shares]
        object.__setattr__(self, "shares", clipped)

    def is_empty(self) -> bool:
        """No GPU draws anything after its work stops (no share above 0)."""
        return not any(s > 0 for shares in self.shares.values() for s in shares)

    def to_json(self) -> dict[str, list[float]]:
        return {str(rank): [float(s) for s in shares] for rank, shares in self.shares.items()}

    @classmethod
    def from_json(cls, data: object) -> AfterWork:
        """From `to_json`'s form (ValueError when it is not that)."""
        if not isinstance(data, dict) or len(data) > 100_000:
            raise ValueError("after-work shares must be an object of pipeline rank → shares")
        shares: dict[int, list[float]] = {}
        for key, values in data.items():
            if not isinstance(values, list) or not all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in values
            ):
                raise ValueError(f"pipeline rank {key!r}: shares must be a list of numbers")
            shares[int(key)] = [float(v) for v in values]
        return cls(shares)


def after_work_energy_j(
    problem: PipelineProblem, frequencies: list[list[int]], after: AfterWork
) -> float:
    """The energy above blocking a plan's GPUs draw after their instructions stop, per
    iteration (J): see the module docstring. `problem`: the problem the plan is scored
    with (its blocking power is the one above which the shares count)."""
    if after.is_empty():
        return 0.0
    line = problem.timeline(frequencies)
    if not line:
        return 0.0
    period = max(x.finish_s for x in line) - min(x.start_s for x in line)
    block_w = problem.p2p_power_w
    edges = (0.0, *AFTER_WORK_EDGES_S)
    by_rank: dict[int, list[ScheduledInstruction]] = {}
    for x in line:
        by_rank.setdefault(x.instruction.rank, []).append(x)
    total = 0.0
    for rank, runs in by_rank.items():
        shares = after.shares.get(rank)
        if not shares:
            continue
        runs.sort(key=lambda x: x.start_s)
        for i, x in enumerate(runs):
            nxt = runs[i + 1].start_s if i + 1 < len(runs) else runs[0].start_s + period
            gap = max(nxt - x.finish_s, 0.0)
            duration = x.finish_s - x.start_s
            if gap <= 0 or duration <= 0:
                continue
            above = max(x.energy_j / duration - block_w, 0.0)
            for k, share in enumerate(shares):
                seconds = min(gap, edges[k + 1]) - edges[k]
                if seconds <= 0:
                    break
                total += share * above * seconds
    return total
