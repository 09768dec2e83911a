"""The time–energy frontier solver.

Profiled options → convex effective-cost hulls → exact parametric LP (breakpoint to
breakpoint) → discrete plans (round + reclaim slack) → exact scores → Pareto set.

    from perseus.solver import solve_frontier
    frontier = solve_frontier(profile, schedule, p2p_power_w=70.38)
    point = frontier.choose(max_slowdown=0.05)
"""

from perseus.solver.frontier import (
    FRONTIER_COLUMNS,
    Frontier,
    FrontierPoint,
    FrontierTable,
    check_frontier_memory,
    choose_index,
    read_frontier_table,
    solve_frontier,
)
from perseus.solver.lp import LPCurve, solve_lp_curve
from perseus.solver.problem import CostHull, SolverProblem, effective_cost_hull
from perseus.solver.rounding import Rounder

__all__ = [
    "CostHull",
    "FRONTIER_COLUMNS",
    "Frontier",
    "FrontierPoint",
    "FrontierTable",
    "LPCurve",
    "Rounder",
    "SolverProblem",
    "check_frontier_memory",
    "choose_index",
    "effective_cost_hull",
    "read_frontier_table",
    "solve_frontier",
    "solve_lp_curve",
]
