"""Planning: the adapter between the domain (profiles, schedules, plans) and the solver.

`solve_frontier` solves one pipeline's time–energy frontier and returns domain plans;
`evaluate`, `timeline` and `make_plan` score plans with the solver's exact accounting, the
project's one implementation of it (the domain cannot import the solver: layers are
errors → domain → io / solver → planning → schedulers → server → cli/demo).

Names are loaded on first use (PEP 562): scoring a plan needs numpy only, while the
frontier brings in scipy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "AfterWork",
    "Frontier",
    "FrontierPoint",
    "PipelineProblem",
    "after_work_energy_j",
    "all_max_plan",
    "calibrate_hop_latency",
    "check_frontier_memory",
    "choose_index",
    "evaluate",
    "evaluate_plan",
    "hop_times",
    "make_plan",
    "max_frequencies",
    "pipeline_problem",
    "solve_frontier",
    "stage_busy_s",
    "timeline",
]

_FRONTIER = {"Frontier", "FrontierPoint", "check_frontier_memory", "solve_frontier"}
_HOPS = {"calibrate_hop_latency", "hop_times"}
_AFTER_WORK = {"AfterWork", "after_work_energy_j"}

if TYPE_CHECKING:
    from perseus.planning.after_work import AfterWork, after_work_energy_j
    from perseus.planning.choice import choose_index
    from perseus.planning.frontier import (
        Frontier,
        FrontierPoint,
        check_frontier_memory,
        solve_frontier,
    )
    from perseus.planning.hops import calibrate_hop_latency, hop_times
    from perseus.planning.problem import (
        PipelineProblem,
        all_max_plan,
        evaluate,
        evaluate_plan,
        make_plan,
        max_frequencies,
        pipeline_problem,
        stage_busy_s,
        timeline,
    )


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name == "choose_index":
        module = "choice"
    elif name in _AFTER_WORK:
        module = "after_work"
    else:
        module = "frontier" if name in _FRONTIER else "hops" if name in _HOPS else "problem"
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
