"""Edge lags (P2P hop latency) in the solver's DAG: accounting against networkx, the LP
against brute force and HiGHS, the frontier and the polish with lags, and zero lags
unchanged."""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pandas as pd
import pytest
from scipy.optimize import linprog
from test_solver_exact import P_BLOCK, all_plans, random_profile

from perseus.domain.profile import InstructionProfile
from perseus.domain.schedule import make_schedule
from perseus.errors import SolverError
from perseus.planning import PipelineProblem, evaluate, solve_frontier
from perseus.solver import OptionTable, SolverProblem, compute_frontier, solve_lp_curve
from perseus.solver.polish import polish_plan

HOP = 0.15  # s: comparable to the random profiles' 1-2 s instructions, so hops shape plans


def random_lagged_problem(rng: np.random.Generator, n: int) -> SolverProblem:
    """A random DAG (nodes numbered topologically), three option types, two resources, and
    a lag on about half of the edges (the others zero)."""
    pairs = {(int(u), int(v)) for u, v in rng.integers(0, n, size=(3 * n, 2)) if u < v}
    edges = sorted(pairs)
    lags = np.where(rng.random(len(edges)) < 0.5, rng.uniform(0.0, 0.5, len(edges)), 0.0)
    options = [
        OptionTable(
            np.sort(rng.uniform(0.5, 2.0, 4)), rng.uniform(50, 150, 4), np.arange(4, dtype=int)
        )
        for _ in range(3)
    ]
    return SolverProblem.build(
        edges=edges,
        type_of=rng.integers(0, 3, n),
        options=options,
        resources=[np.arange(0, n, 2), np.arange(1, n, 2)],
        p2p_power_w=P_BLOCK,
        edge_lag_s=lags,
    )


def networkx_schedule(problem: SolverProblem, durations: np.ndarray):
    """(earliest starts, longest path, latest starts at that deadline) by networkx: node i's
    weight on its out-edges, each edge's lag added to its weight."""
    g = nx.DiGraph()
    g.add_nodes_from(["src", "end", *range(problem.n)])
    for i in range(problem.n):
        g.add_edge("src", i, weight=0.0)
        g.add_edge(i, "end", weight=float(durations[i]))
    for (u, v), lag in zip(problem.edges.tolist(), problem.edge_lag_s, strict=True):
        g.add_edge(u, v, weight=float(durations[u]) + float(lag))
    T = nx.dag_longest_path_length(g, weight="weight")
    start = {}
    for node in nx.topological_sort(g):
        if node != "src":
            start[node] = max(
                start.get(p, 0.0) + g[p][node]["weight"] for p in g.predecessors(node)
            )
    tail = {}  # longest path from each node to the end, its own duration included
    for node in reversed(list(nx.topological_sort(g))):
        if node != "end":
            tail[node] = max(g[node][s]["weight"] + tail.get(s, 0.0) for s in g.successors(node))
    starts = np.array([start[i] for i in range(problem.n)])
    latest = np.array([T - tail[i] for i in range(problem.n)])
    return starts, T, latest


@pytest.mark.parametrize("seed", range(4))
def test_lagged_accounting_equals_networkx_longest_paths(seed):
    rng = np.random.default_rng(seed)
    problem = random_lagged_problem(rng, 40)
    assert problem.has_lags
    choice = rng.integers(0, 4, size=(problem.n, 6))
    time_s, energy_j = problem.choices_to_arrays(choice)
    start, _ = problem.start_finish(time_s)
    T, E, C, B = problem.account(choice)
    for k in range(choice.shape[1]):
        nx_start, nx_T, nx_latest = networkx_schedule(problem, time_s[:, k])
        assert start[:, k] == pytest.approx(nx_start, rel=1e-12, abs=1e-12)
        assert T[k] == pytest.approx(nx_T, rel=1e-12)
        latest = problem.latest_starts(time_s[:, k], T[k])
        assert latest == pytest.approx(nx_latest, rel=1e-12, abs=1e-12)
        # Energy keeps its form: hop time is blocking time.
        compute_e = math.fsum(energy_j[:, k])
        assert C[k] == pytest.approx(compute_e, rel=1e-13)
        blocking = P_BLOCK * (problem.num_resources * nx_T - math.fsum(time_s[:, k]))
        assert B[k] == pytest.approx(blocking, rel=1e-9)
        assert E[k] == C[k] + B[k]
    # Without the lags the same plans are faster: the lags were on critical paths.
    free = problem.with_edge_lag(None)
    assert not free.has_lags
    assert np.all(free.makespan(time_s) < T)


def test_with_edge_lag_equals_a_problem_built_with_the_lags():
    rng = np.random.default_rng(9)
    problem = random_lagged_problem(rng, 30)
    lags = rng.uniform(0, 0.3, len(problem.edges))
    rebuilt = SolverProblem.build(
        edges=problem.edges,
        type_of=problem.type_of,
        options=problem.type_options,
        resources=problem.resources,
        p2p_power_w=P_BLOCK,
        edge_lag_s=lags,
    )
    choice = rng.integers(0, 4, size=(problem.n, 5))
    for a, b in zip(problem.with_edge_lag(lags).score(choice), rebuilt.score(choice), strict=True):
        assert np.array_equal(a, b)
    assert not np.array_equal(problem.score(choice)[0], rebuilt.score(choice)[0])


@pytest.mark.parametrize(
    ("lags", "message"),
    [
        ([0.1], "one lag per edge"),
        ([0.0, -0.1, 0.0], "edge (1, 2) has -0.1"),
        ([0.0, 0.0, math.nan], "finite"),
        ([math.inf, 0.0, 0.0], "finite"),
    ],
)
def test_bad_lags_are_a_clear_solver_error(lags, message):
    option = OptionTable(np.array([1.0]), np.array([1.0]), np.array([1]))
    with pytest.raises(SolverError, match=message.replace("(", r"\(").replace(")", r"\)")):
        SolverProblem.build(
            edges=[(0, 1), (1, 2), (0, 2)],
            type_of=[0, 0, 0],
            options=[option],
            resources=[[0, 1, 2]],
            p2p_power_w=P_BLOCK,
            edge_lag_s=lags,
        )


def test_pipeline_hops_are_on_cross_rank_edges_only():
    rng = np.random.default_rng(4)
    profile = random_profile(rng, 3, 3)
    schedule = make_schedule("interleaved", 2, 4)  # 2 ranks, 2 chunks: some stage changes
    with pytest.raises(Exception):  # noqa: B017 - the profile has 3 stages, not 4
        PipelineProblem(profile, schedule, P_BLOCK)
    profile = random_profile(rng, 4, 3)
    pp = PipelineProblem(profile, schedule, P_BLOCK, hop_latency_s=HOP)
    ins = pp.instructions
    for (u, v), lag in zip(pp.solver.edges.tolist(), pp.solver.edge_lag_s, strict=True):
        assert lag == (HOP if ins[u].rank != ins[v].rank else 0.0)
    assert pp.cross_rank.any() and not pp.cross_rank.all()
    with pytest.raises(SolverError, match="between 0 and 10 s"):
        PipelineProblem(profile, schedule, P_BLOCK, hop_latency_s=-0.001)
    with pytest.raises(SolverError, match="between 0 and 10 s"):
        PipelineProblem(profile, schedule, P_BLOCK, hop_latency_s=math.nan)


def test_evaluate_with_hops_equals_the_schedule_dags_longest_path():
    rng = np.random.default_rng(21)
    profile = random_profile(rng, 3, 4)
    schedule = make_schedule("1f1b", 3, 4)
    pp = PipelineProblem(profile, schedule, P_BLOCK)
    choice = rng.integers(0, 4, pp.solver.n)
    freqs = pp.frequencies_of(choice)
    time_s, _ = pp.solver.choices_to_arrays(choice)
    dur = dict(zip(pp.instructions, time_s, strict=True))
    g = nx.DiGraph()
    for u, v in schedule.dag().edges():
        g.add_edge(u, v, weight=dur[u] + (HOP if u.rank != v.rank else 0.0))
    for u in pp.instructions:
        g.add_edge(u, "end", weight=dur[u])
    ev = evaluate(profile, schedule, freqs, P_BLOCK, hop_latency_s=HOP)
    assert ev.iteration_time_s == pytest.approx(nx.dag_longest_path_length(g), rel=1e-13)
    free = evaluate(profile, schedule, freqs, P_BLOCK)
    # 1F1B on 3 ranks: the critical path crosses at least 2·(S−1) hops.
    assert ev.iteration_time_s >= free.iteration_time_s + 4 * HOP - 1e-12


def lagged_lp_by_highs(problem: SolverProblem, deadline: float) -> float:
    """min Σ cᵢ(dᵢ) s.t. x_v ≥ x_u + d_u + lag(u, v), x_i + d_i ≤ T, for HiGHS."""
    n = problem.n
    rows, b = [], []
    for (u, v), lag in zip(problem.edges.tolist(), problem.edge_lag_s, strict=True):
        r = np.zeros(3 * n)
        r[u], r[n + u], r[v] = 1, 1, -1
        rows.append(r)
        b.append(-float(lag))
    for i in range(n):
        r = np.zeros(3 * n)
        r[i], r[n + i] = 1, 1
        rows.append(r)
        b.append(deadline)
        hull = problem.hulls[problem.type_of[i]]
        for k, slope in enumerate(hull.slopes_w):
            r = np.zeros(3 * n)
            r[2 * n + i], r[n + i] = -1, -slope
            rows.append(r)
            b.append(-(hull.cost_j[k] + slope * hull.time_s[k]))
        r = np.zeros(3 * n)
        r[2 * n + i] = -1
        rows.append(r)
        b.append(-hull.cost_j[-1])
    bounds = [(0, None)] * n
    bounds += [(problem.hulls[problem.type_of[i]].time_s[0], None) for i in range(n)]
    bounds += [(None, None)] * n
    c = np.concatenate([np.zeros(2 * n), np.ones(n)])
    res = linprog(c, A_ub=np.array(rows), b_ub=np.array(b), bounds=bounds, method="highs")
    assert res.status == 0, res.message
    return float(res.fun)


@pytest.mark.parametrize(("num_stages", "num_microbatches"), [(2, 3), (3, 4)])
def test_lagged_lp_curve_matches_highs(num_stages, num_microbatches):
    rng = np.random.default_rng(num_stages * 5 + num_microbatches)
    profile = random_profile(rng, num_stages, 5)
    schedule = make_schedule("1f1b", num_stages, num_microbatches)
    problem = PipelineProblem(profile, schedule, P_BLOCK, hop_latency_s=HOP).solver
    curve = solve_lp_curve(problem)
    free = solve_lp_curve(problem.with_edge_lag(None))
    assert curve.time_s[0] > free.time_s[0]  # the hops lengthen the minimum time
    probes = np.concatenate([curve.time_s, np.linspace(curve.time_s[0], curve.time_s[-1], 7)])
    for deadline in probes:
        expected = lagged_lp_by_highs(problem, float(deadline))
        assert curve.effective_cost(deadline) == pytest.approx(expected, rel=1e-7, abs=1e-6)


@pytest.mark.parametrize(
    ("num_stages", "num_microbatches", "num_options"), [(2, 2, 3), (2, 3, 2), (3, 2, 2)]
)
@pytest.mark.parametrize("seed", [0, 1])
def test_lagged_frontier_against_brute_force(num_stages, num_microbatches, num_options, seed):
    """The LP stays a true lower bound with lags, the frontier is Pareto, every point's
    numbers are its exact re-score at the hop latency, and it is near the optimum."""
    rng = np.random.default_rng(100 * seed + 10 * num_stages + num_microbatches)
    profile = random_profile(rng, num_stages, num_options)
    schedule = make_schedule("1f1b", num_stages, num_microbatches)
    problem = PipelineProblem(profile, schedule, P_BLOCK, hop_latency_s=HOP).solver
    T_all, E_all = all_plans(problem)
    frontier = solve_frontier(
        profile, schedule, p2p_power_w=P_BLOCK, max_points=None, hop_latency_s=HOP
    )
    assert frontier.hop_latency_s == HOP
    times = np.array([p.iteration_time_s for p in frontier.points])
    energies = np.array([p.energy_j for p in frontier.points])
    assert np.all(np.diff(times) > 0) and np.all(np.diff(energies) < 0)
    assert times[0] == T_all.min()
    for p in frontier.points:
        ev = evaluate(profile, schedule, p.frequencies, P_BLOCK, hop_latency_s=HOP)
        assert (ev.iteration_time_s, ev.energy_j) == (p.iteration_time_s, p.energy_j)
        best = E_all[T_all <= p.iteration_time_s * (1 + 1e-9)].min()
        assert p.lower_bound_j <= best * (1 + 1e-9)  # a true bound
        # Two plans' times may differ in the last bits only: compare exactly here (the
        # scores are the same arithmetic), not within the bound's tolerance.
        assert p.energy_j <= 1.01 * E_all[T_all <= p.iteration_time_s].min()
    curve = frontier.lp_curve
    for deadline in np.unique(T_all):
        optimum = E_all[T_all <= deadline * (1 + 1e-9)].min()
        assert float(curve.lower_bound(deadline)) <= optimum * (1 + 1e-9)
        ours = frontier.choose(deadline_s=float(deadline)).energy_j
        assert optimum * (1 - 1e-9) <= ours <= 1.01 * optimum, (deadline, ours, optimum)
    # A hop-free frontier's plans are slower than they claim once hops cost time.
    free = solve_frontier(profile, schedule, p2p_power_w=P_BLOCK, max_points=None)
    claimed = free.points[0].iteration_time_s
    real = evaluate(profile, schedule, free.points[0].frequencies, P_BLOCK, hop_latency_s=HOP)
    assert real.iteration_time_s > claimed


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_polish_with_lags_one_window_is_the_brute_force_optimum(seed):
    rng = np.random.default_rng(30 + seed)
    profile = random_profile(rng, 2, 3)
    schedule = make_schedule("1f1b", 2, 3)
    problem = PipelineProblem(profile, schedule, P_BLOCK, hop_latency_s=HOP).solver
    T_all, E_all = all_plans(problem)
    for start in (problem.reference_choice(), rng.integers(0, 3, problem.n)):
        (T0,), _, _ = problem.score(start[:, None])
        result = polish_plan(problem, start, window_s=2 * T0)
        assert result.iteration_time_s <= T0
        assert result.energy_j == pytest.approx(E_all[T_all <= T0].min(), rel=1e-6)
        (T1,), (E1,), _ = problem.score(result.choice[:, None])
        assert (result.iteration_time_s, result.energy_j) == (T1, E1)


def test_small_polish_windows_hold_the_lagged_iteration_time(real_profile_path):
    frame = pd.read_csv(real_profile_path)
    profile = InstructionProfile.from_frame(frame[frame["stage"] < 4].reset_index(drop=True))
    schedule = make_schedule("1f1b", 4, 6)
    pp = PipelineProblem(profile, schedule, 70.38, hop_latency_s=0.002)
    frontier = solve_frontier(
        profile, schedule, p2p_power_w=70.38, max_points=4, hop_latency_s=0.002
    )
    for point in frontier.points:
        choice = pp.choice_of(point.frequencies)
        result = polish_plan(pp.solver, choice, window_s=point.iteration_time_s / 5)
        assert result.iteration_time_s <= point.iteration_time_s
        assert result.energy_j <= point.energy_j
        ev = pp.evaluate(pp.frequencies_of(result.choice))
        assert ev.iteration_time_s == result.iteration_time_s and ev.energy_j == result.energy_j


def test_zero_lags_are_bit_identical_on_a_real_profile(real_profile_path):
    """Lags omitted, explicit zero lags, a zero hop latency and a problem re-lagged to zero:
    the same frontier to the last bit (times, energies, bounds, plans, LP curve)."""
    frame = pd.read_csv(real_profile_path)
    profile = InstructionProfile.from_frame(frame[frame["stage"] < 4].reset_index(drop=True))
    schedule = make_schedule("1f1b", 4, 8)
    omitted = PipelineProblem(profile, schedule, 70.38).solver
    explicit = SolverProblem.build(
        edges=omitted.edges,
        type_of=omitted.type_of,
        options=omitted.type_options,
        resources=omitted.resources,
        p2p_power_w=70.38,
        lead_ramp=omitted.lead_ramp,
        edge_lag_s=np.zeros(len(omitted.edges)),
    )
    zero_hop = PipelineProblem(profile, schedule, 70.38, hop_latency_s=0.0).solver
    relagged = PipelineProblem(profile, schedule, 70.38, hop_latency_s=0.002).solver
    relagged = relagged.with_edge_lag(np.zeros(len(omitted.edges)))
    reference = compute_frontier(omitted, max_points=None)
    for problem in (explicit, zero_hop, relagged):
        other = compute_frontier(problem, max_points=None)
        for name in ("time_s", "energy_j", "lower_bound_j", "compute_energy_j", "choice"):
            assert np.array_equal(getattr(reference, name), getattr(other, name)), name
        assert np.array_equal(reference.lp_curve.time_s, other.lp_curve.time_s)
        assert np.array_equal(reference.lp_curve.cost_j, other.lp_curve.cost_j)
    lagged = compute_frontier(PipelineProblem(profile, schedule, 70.38, hop_latency_s=0.002).solver)
    assert lagged.time_s[0] > reference.time_s[0]  # and a lag does change it
