"""The time–energy frontier solver, generic: a DAG whose nodes each run one of a table of options.

Option tables → convex effective-cost hulls → exact parametric LP (breakpoint to
breakpoint) → discrete plans (round + reclaim slack) → exact scores → Pareto set.

It knows nothing of profiles, schedules, plans or files (it imports only numpy, scipy and
`perseus.errors`); `perseus.planning` builds its problem from a profile and a pipeline
schedule and turns its points back into plans::

    from perseus.solver import OptionTable, SolverProblem, compute_frontier
    problem = SolverProblem.build(edges=..., type_of=..., options=[OptionTable(...)],
                                  resources=..., p2p_power_w=70.38)
    solution = compute_frontier(problem)  # times, energies, bounds, option per node

Names are loaded on first use (PEP 562), so ``import perseus.solver`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "Accounting",
    "CostHull",
    "FrontierSolution",
    "LPCurve",
    "OptionTable",
    "PolishResult",
    "Rounder",
    "SolverProblem",
    "compute_frontier",
    "effective_cost_hull",
    "polish_plan",
    "solve_lp_curve",
    "staggered_lead",
]

_WHERE = {
    "Accounting": "problem",
    "CostHull": "hull",
    "FrontierSolution": "frontier",
    "LPCurve": "lp",
    "OptionTable": "problem",
    "PolishResult": "polish",
    "Rounder": "rounding",
    "SolverProblem": "problem",
    "compute_frontier": "frontier",
    "effective_cost_hull": "hull",
    "polish_plan": "polish",
    "solve_lp_curve": "lp",
    "staggered_lead": "frontier",
}

if TYPE_CHECKING:
    from perseus.solver.frontier import FrontierSolution, compute_frontier, staggered_lead
    from perseus.solver.hull import CostHull, effective_cost_hull
    from perseus.solver.lp import LPCurve, solve_lp_curve
    from perseus.solver.polish import PolishResult, polish_plan
    from perseus.solver.problem import Accounting, OptionTable, SolverProblem
    from perseus.solver.rounding import Rounder


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
