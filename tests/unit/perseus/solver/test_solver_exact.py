"""The solver against ground truth on tiny instances: brute force and scipy's HiGHS LP, and
the one accounting implementation against path enumeration."""

from __future__ import annotations

import itertools
import math

import networkx as nx
import numpy as np
import pandas as pd
import pytest
from scipy.optimize import linprog

from perseus.domain.profile import InstructionProfile
from perseus.domain.schedule import make_schedule
from perseus.planning import (
    PipelineProblem,
    evaluate,
    max_frequencies,
    solve_frontier,
    timeline,
)
from perseus.solver import SolverProblem, effective_cost_hull, solve_lp_curve

P_BLOCK = 70.0


def random_profile(
    rng: np.random.Generator, num_stages: int, num_options: int
) -> InstructionProfile:
    """Each (stage, kind): `num_options` options, faster ones mostly costing more energy."""
    rows = []
    freqs = 1500 - 100 * np.arange(num_options)
    for stage in range(num_stages):
        for kind, base in (("forward", 1.0), ("backward", 2.0)):
            t = base * rng.uniform(0.8, 1.2) * np.sort(rng.uniform(1.0, 1.6, num_options))
            e = 300 * t[0] * np.sort(rng.uniform(0.6, 1.0, num_options))[::-1] + rng.uniform(
                -5, 5, num_options
            )
            rows += [
                (stage, kind, int(f), float(a), float(b))
                for f, a, b in zip(freqs, t, e, strict=True)
            ]
    frame = pd.DataFrame(rows, columns=["stage", "instruction", "frequency", "time", "energy"])
    return InstructionProfile.from_frame(frame)


def all_plans(problem: SolverProblem) -> tuple[np.ndarray, np.ndarray]:
    """(T, E) of every discrete plan, scored with the solver's exact accounting."""
    counts = problem.opt_count[problem.type_of]
    grid = np.array(list(itertools.product(*[range(c) for c in counts])), dtype=np.int64).T
    T, E, _ = problem.score(grid)
    return T, E


CASES = [(2, 1, 4), (2, 2, 3), (2, 3, 2), (3, 1, 4), (3, 2, 2), (3, 3, 2)]


@pytest.mark.parametrize(("num_stages", "num_microbatches", "num_options"), CASES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_against_brute_force(num_stages, num_microbatches, num_options, seed):
    rng = np.random.default_rng(1000 * seed + 10 * num_stages + num_microbatches)
    profile = random_profile(rng, num_stages, num_options)
    schedule = make_schedule("1f1b", num_stages, num_microbatches)
    pipeline = PipelineProblem(profile, schedule, P_BLOCK)
    problem = pipeline.solver
    T_all, E_all = all_plans(problem)
    frontier = solve_frontier(profile, schedule, p2p_power_w=P_BLOCK, max_points=None)
    curve = frontier.lp_curve
    t_fast = frontier.points[0].iteration_time_s
    deadlines = np.unique(np.concatenate([np.linspace(t_fast, T_all.max(), 12), T_all]))
    deadlines = deadlines[deadlines >= t_fast]
    for deadline in deadlines:
        fits = T_all <= deadline * (1 + 1e-9)
        optimum = E_all[fits].min()
        bound = float(curve.lower_bound(deadline))
        ours = frontier.choose(deadline_s=float(deadline)).energy_j
        assert bound <= optimum * (1 + 1e-9), (deadline, bound, optimum)
        assert optimum <= ours * (1 + 1e-9)
        assert ours <= 1.01 * optimum, (deadline, ours, optimum)
    # Every frontier point's bound is a true lower bound at its own time.
    for p in frontier.points:
        best = E_all[T_all <= p.iteration_time_s * (1 + 1e-9)].min()
        assert p.lower_bound_j <= best * (1 + 1e-9)


def capped_profile(
    rng: np.random.Generator, num_stages: int, num_options: int
) -> InstructionProfile:
    """`random_profile` with a power-capped top clock, as on real A40s: every (stage, kind)
    runs 1-5 % slower at its highest frequency than at the one below it, for about the
    same energy (so options are not monotone in frequency)."""
    frame = random_profile(rng, num_stages, num_options).to_frame()
    for _, rows in frame.groupby(["stage", "instruction"]):
        top, second = rows.sort_values("frequency", ascending=False).index[:2]
        frame.loc[top, "time"] = frame.loc[second, "time"] * rng.uniform(1.01, 1.05)
        frame.loc[top, "energy"] = frame.loc[second, "energy"] * rng.uniform(0.97, 1.03)
    return InstructionProfile.from_frame(frame)


@pytest.mark.parametrize(("num_stages", "num_microbatches", "num_options"), CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_fast_end_and_no_slowdown_against_brute_force_with_a_capped_top_clock(
    num_stages, num_microbatches, num_options, seed
):
    """The frontier starts at the minimum time over every plan (not at all-max), and "no
    slowdown" is the cheapest plan with T <= T(all-max), whatever clocks it uses."""
    rng = np.random.default_rng(1000 * seed + 10 * num_stages + num_microbatches + 7)
    profile = capped_profile(rng, num_stages, num_options)
    schedule = make_schedule("1f1b", num_stages, num_microbatches)
    problem = PipelineProblem(profile, schedule, P_BLOCK).solver
    T_all, E_all = all_plans(problem)
    frontier = solve_frontier(profile, schedule, p2p_power_w=P_BLOCK, max_points=None)
    all_max = evaluate(profile, schedule, max_frequencies(profile, schedule), P_BLOCK)
    assert frontier.all_max is not None
    assert frontier.all_max.iteration_time_s == all_max.iteration_time_s
    assert frontier.all_max.energy_j == all_max.energy_j

    first = frontier.points[0]
    assert first.iteration_time_s == T_all.min() < all_max.iteration_time_s
    assert frontier.slowdown(first) < 0
    at_min = E_all[T_all <= T_all.min() * (1 + 1e-12)].min()
    assert at_min * (1 - 1e-9) <= first.energy_j <= 1.01 * at_min

    no_slowdown = frontier.choose(max_slowdown=0.0)
    fits = T_all <= all_max.iteration_time_s * (1 + 1e-9)
    optimum = E_all[fits].min()
    assert no_slowdown.iteration_time_s <= all_max.iteration_time_s * (1 + 1e-9)
    assert optimum * (1 - 1e-9) <= no_slowdown.energy_j <= 1.01 * optimum
    assert no_slowdown.energy_j == min(
        p.energy_j
        for p in frontier.points
        if p.iteration_time_s <= all_max.iteration_time_s * (1 + 1e-9)
    )
    # Every deadline from the minimum time up, faster than all-max included.
    for deadline in np.unique(T_all[T_all <= all_max.iteration_time_s * 1.05]):
        best = E_all[T_all <= deadline * (1 + 1e-9)].min()
        ours = frontier.choose(deadline_s=float(deadline)).energy_j
        assert best * (1 - 1e-9) <= ours <= 1.01 * best, (deadline, ours, best)


def lp_by_highs(problem: SolverProblem, deadline: float) -> float:
    """min Σ cᵢ(dᵢ) s.t. longest path ≤ deadline, as an explicit LP for HiGHS."""
    n = problem.n
    # Variables: start x (n), duration d (n), cost z (n).
    nv = 3 * n
    A, b = [], []

    def row() -> np.ndarray:
        return np.zeros(nv)

    for u, v in problem.edges:  # x_u + d_u - x_v <= 0
        r = row()
        r[u], r[n + u], r[v] = 1, 1, -1
        A.append(r)
        b.append(0.0)
    for i in range(n):
        r = row()  # x_i + d_i <= T
        r[i], r[n + i] = 1, 1
        A.append(r)
        b.append(deadline)
        hull = problem.hulls[problem.type_of[i]]
        for k, slope in enumerate(hull.slopes_w):  # z >= C_k - slope (d - t_k)
            r = row()
            r[2 * n + i], r[n + i] = -1, -slope
            A.append(r)
            b.append(-(hull.cost_j[k] + slope * hull.time_s[k]))
        r = row()  # z >= C_last (flat to the right)
        r[2 * n + i] = -1
        A.append(r)
        b.append(-hull.cost_j[-1])
    bounds = [(0, None)] * n
    bounds += [(problem.hulls[problem.type_of[i]].time_s[0], None) for i in range(n)]
    bounds += [(None, None)] * n
    c = np.concatenate([np.zeros(2 * n), np.ones(n)])
    res = linprog(c, A_ub=np.array(A), b_ub=np.array(b), bounds=bounds, method="highs")
    assert res.status == 0, res.message
    return float(res.fun)


@pytest.mark.parametrize(("num_stages", "num_microbatches"), [(2, 3), (3, 4), (4, 6)])
def test_lp_curve_matches_highs(num_stages, num_microbatches):
    rng = np.random.default_rng(num_stages * 7 + num_microbatches)
    profile = random_profile(rng, num_stages, 6)
    schedule = make_schedule("1f1b", num_stages, num_microbatches)
    pipeline = PipelineProblem(profile, schedule, P_BLOCK)
    problem = pipeline.solver
    curve = solve_lp_curve(problem)
    assert np.all(np.diff(curve.time_s) > 0)
    assert np.all(np.diff(curve.cost_j) < 0)  # F strictly decreasing between breakpoints
    slopes = np.diff(curve.cost_j) / np.diff(curve.time_s)
    assert np.all(np.diff(slopes) >= -1e-6 * np.abs(slopes[:-1]))  # convex
    probes = np.concatenate([curve.time_s, np.linspace(curve.time_s[0], curve.time_s[-1], 9)[1:-1]])
    for deadline in probes:
        expected = lp_by_highs(problem, float(deadline))
        assert curve.effective_cost(deadline) == pytest.approx(expected, rel=1e-7, abs=1e-6)


def test_lp_on_a_chain_is_the_sum_of_hulls():
    """One stage, one microbatch: F then B in series; F(T) is the inf-convolution of two hulls."""
    rng = np.random.default_rng(5)
    profile = random_profile(rng, 1, 5)
    schedule = make_schedule("1f1b", 1, 1)
    pipeline = PipelineProblem(profile, schedule, P_BLOCK)
    problem = pipeline.solver
    curve = solve_lp_curve(problem)
    hf, hb = problem.hulls
    for deadline in np.linspace(curve.time_s[0], curve.time_s[-1], 25):
        ts = np.linspace(hf.time_s[0], hf.time_s[-1], 4001)
        ts = ts[deadline - ts >= hb.time_s[0] - 1e-12]
        best = (hf(ts) + hb(np.maximum(deadline - ts, hb.time_s[0]))).min()
        assert curve.effective_cost(deadline) == pytest.approx(best, rel=1e-4)


def test_hull_is_below_every_option_and_non_increasing():
    rng = np.random.default_rng(3)
    t = rng.uniform(0.1, 0.3, 40)
    e = 200 * (0.4 - t) ** 2 + rng.uniform(0, 2, 40)  # noisy, energy rises again when slow
    hull = effective_cost_hull(t, e, P_BLOCK)
    eff = e - P_BLOCK * t
    assert hull.time_s[0] == t.min()
    assert np.all(np.diff(hull.time_s) > 0)
    assert np.all(np.diff(hull.cost_j) < 0)
    assert np.all(np.diff(hull.slopes_w) < 0)  # convex
    # Every option lies on or above the hull extended as a constant past its minimum
    # (np.interp clamps): a lower bound for the LP, the right of the minimum included.
    assert np.all(hull(t) <= eff + 1e-9)
    slow = t > hull.time_s[-1]
    assert slow.any()  # the noisy tail past the minimum is really checked
    assert np.all(hull(t[slow]) == hull.cost_j[-1])
    # Vertices are real options.
    for x, y in zip(hull.time_s, hull.cost_j, strict=True):
        assert np.any(np.isclose(t, x) & np.isclose(eff, y))


def brute_force_accounting(profile, schedule, frequencies, p2p_power_w):
    """(T, E, compute E, blocking E) of one plan, computed independently of the solver:
    every path of the DAG enumerated with networkx, the longest one is ``T``."""
    dag = schedule.dag()
    cost = {}
    for order, freqs in zip(schedule.orders, frequencies, strict=True):
        for instr, freq in zip(order, freqs, strict=True):
            opts = schedule.options(profile, instr)
            k = int(np.flatnonzero(opts.freq_mhz == freq)[0])
            cost[instr] = (float(opts.time_s[k]), float(opts.energy_j[k]))
    sources = [v for v in dag if dag.in_degree(v) == 0]
    sinks = [v for v in dag if dag.out_degree(v) == 0]
    T = max(
        sum(cost[v][0] for v in path)
        for s in sources
        for t in sinks
        for path in ([[s]] if s == t else nx.all_simple_paths(dag, s, t))
    )
    compute_e = math.fsum(e for _, e in cost.values())
    compute_t = math.fsum(t for t, _ in cost.values())
    blocking = p2p_power_w * (schedule.num_stages * T - compute_t)
    return T, compute_e + blocking, compute_e, blocking


@pytest.mark.parametrize(
    ("name", "num_stages", "num_microbatches"), [("1f1b", 3, 4), ("interleaved", 2, 4)]
)
def test_evaluate_equals_a_brute_force_longest_path(name, num_stages, num_microbatches):
    """The one accounting implementation (the solver's exact scoring, reached through
    `perseus.planning.evaluate`) against path enumeration on small DAGs."""
    rng = np.random.default_rng(11)
    profile = random_profile(rng, num_stages, 4)
    schedule = make_schedule(name, num_stages, num_microbatches)
    pipeline = PipelineProblem(profile, schedule, P_BLOCK)
    choice = rng.integers(0, 4, size=(pipeline.solver.n, 12))
    for k in range(choice.shape[1]):
        freqs = pipeline.frequencies_of(choice[:, k])
        ev = evaluate(profile, schedule, freqs, P_BLOCK)
        T, E, C, B = brute_force_accounting(profile, schedule, freqs, P_BLOCK)
        assert ev.iteration_time_s == pytest.approx(T, rel=1e-13)
        assert ev.energy_j == pytest.approx(E, rel=1e-12)
        assert ev.compute_energy_j == pytest.approx(C, rel=1e-13)
        assert ev.blocking_energy_j == pytest.approx(B, rel=1e-9, abs=1e-9)
        assert ev.energy_j == ev.compute_energy_j + ev.blocking_energy_j
        # The timeline places every instruction at its earliest start: the same T.
        placed = timeline(profile, schedule, freqs)
        assert max(p.finish_s for p in placed) == ev.iteration_time_s
        assert all(p.finish_s > p.start_s >= 0 for p in placed)


def test_batched_scoring_equals_one_plan_scoring():
    """Scoring many plans at once gives each plan's numbers bit for bit (exact sums);
    the fast sums differ by rounding only."""
    rng = np.random.default_rng(11)
    profile = random_profile(rng, 3, 4)
    schedule = make_schedule("1f1b", 3, 5)
    pipeline = PipelineProblem(profile, schedule, P_BLOCK)
    problem = pipeline.solver
    choice = rng.integers(0, 4, size=(problem.n, 20))
    for block in (choice, choice[:, :1], choice[:, 3:5]):
        T, E, C = problem.score(block)
        fast_T, fast_E, _ = problem.score(block, exact=False)
        for k in range(block.shape[1]):
            ev = evaluate(profile, schedule, pipeline.frequencies_of(block[:, k]), P_BLOCK)
            assert T[k] == ev.iteration_time_s
            assert E[k] == ev.energy_j  # bit for bit: same additions in the same order
            assert C[k] == ev.compute_energy_j
            assert fast_T[k] == T[k]
            assert fast_E[k] == pytest.approx(E[k], rel=1e-13)


@pytest.mark.parametrize(
    ("name", "num_microbatches"), [("1f1b", 5), ("gpipe", 4), ("interleaved", 6)]
)
def test_levels_are_slices_and_index_arrays_agree(name, num_microbatches):
    rng = np.random.default_rng(12)
    profile = random_profile(rng, 3, 4)
    schedule = make_schedule(name, 3, num_microbatches)
    pipeline = PipelineProblem(profile, schedule, P_BLOCK)
    problem = pipeline.solver
    # The schedules' topological order is generation by generation, so the hot loops
    # index every level with a slice (views, not copies).
    assert all(isinstance(rows, slice) for rows in problem.level_rows)
    assert [np.arange(problem.n)[rows].tolist() for rows in problem.level_rows] == [
        lv.tolist() for lv in problem.levels
    ]
    durations = rng.uniform(0.5, 2.0, size=(problem.n, 7))
    start, finish = problem.start_finish(durations)
    latest = problem.latest_starts(durations, finish.max(axis=0))
    problem.level_rows = list(problem.levels)  # the index-array path, for any other order
    start_a, finish_a = problem.start_finish(durations)
    assert np.array_equal(start, start_a) and np.array_equal(finish, finish_a)
    assert np.array_equal(latest, problem.latest_starts(durations, finish.max(axis=0)))
