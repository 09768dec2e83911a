"""Dense profiles (smooth, model-made: almost every clock on the hull): the sweep runs on
merged hull segments, its curve stays a true lower bound, and the frontier stays within
0.1 % of the exact sweep's."""

from __future__ import annotations

import numpy as np
import pytest
from test_solver_lags import lagged_lp_by_highs

import perseus.solver.lp as lp_module
from perseus.domain.profile import InstructionProfile
from perseus.domain.schedule import make_schedule
from perseus.planning import PipelineProblem, evaluate
from perseus.solver import compute_frontier, solve_lp_curve
from perseus.solver.hull import CostHull
from perseus.solver.lp import sweep_hulls
from perseus.synth import synthesize_profile

P_BLOCK = 119.0  # the H100's blocking power


@pytest.fixture(scope="module")
def dense_profile() -> InstructionProfile:
    frame = synthesize_profile("H100-SXM", [1.0, 1.1, 0.9, 0.8])
    return InstructionProfile.from_frame(frame, source="synth-h100")


def test_dense_hulls_are_merged_into_chords_of_real_options(dense_profile):
    problem = PipelineProblem(dense_profile, make_schedule("1f1b", 4, 4), P_BLOCK).solver
    hulls, excess = sweep_hulls(problem.hulls)
    for hull, coarse, extra in zip(problem.hulls, hulls, excess, strict=True):
        assert len(hull.time_s) > lp_module._DENSE_HULL  # the synthetic model is dense
        assert 2 <= len(coarse.time_s) < len(hull.time_s) / 2
        # Kept vertices are vertices of the hull (real options), both ends included.
        assert set(coarse.time_s) <= set(hull.time_s)
        assert coarse.time_s[0] == hull.time_s[0] and coarse.time_s[-1] == hull.time_s[-1]
        above = coarse(hull.time_s) - hull.cost_j
        assert above.min() >= -1e-9 and extra == pytest.approx(above.max())
        slopes = coarse.slopes_w
        assert np.all(slopes[:-1] > lp_module._MERGE_RATIO * slopes[1:] * (1 - 1e-12)) or (
            len(slopes) == 1
        )
    # Measured profiles (8-9 hull vertices) are left as they are.
    first = problem.hulls[0]
    sparse = CostHull(time_s=first.time_s[:10], cost_j=first.cost_j[:10])
    kept, none = sweep_hulls([sparse])
    assert kept[0] is sparse and none[0] == 0.0


@pytest.mark.parametrize("hop_latency_s", [0.0, 0.02])
def test_the_merged_sweep_is_a_true_lower_bound_within_its_excess(dense_profile, hop_latency_s):
    problem = PipelineProblem(
        dense_profile, make_schedule("1f1b", 4, 3), P_BLOCK, hop_latency_s=hop_latency_s
    ).solver
    curve = solve_lp_curve(problem)
    slack = float(sweep_hulls(problem.hulls)[1][problem.type_of].sum())
    assert slack > 0
    probes = np.linspace(curve.time_s[0], curve.time_s[-1], 9)
    for deadline in probes:
        exact = lagged_lp_by_highs(problem, float(deadline))  # every hull vertex
        reported = float(curve.effective_cost(deadline))
        assert reported <= exact + 1e-7 * abs(exact)
        assert reported >= exact - slack - 1e-7 * abs(exact)


def test_the_dense_frontier_is_within_a_tenth_of_a_percent_of_the_exact_sweep(
    dense_profile, monkeypatch
):
    schedule = make_schedule("1f1b", 4, 8)
    pipeline = PipelineProblem(dense_profile, schedule, P_BLOCK)
    fast = compute_frontier(pipeline.solver, max_points=None)
    with monkeypatch.context() as patch:  # every vertex swept, every breakpoint rounded
        patch.setattr(lp_module, "_DENSE_HULL", 10**6)
        exact = compute_frontier(pipeline.solver, max_points=None)
    assert fast.stats["lp_breakpoints"] < exact.stats["lp_breakpoints"] / 2
    for t, e in zip(exact.time_s, exact.energy_j, strict=True):
        k = np.searchsorted(fast.time_s, t * (1 + 1e-12), side="right") - 1
        assert fast.energy_j[k] <= e * 1.001, (t, fast.energy_j[k], e)
    # Every point is exactly scored, and no better than its (merged-sweep) bound.
    assert np.all(fast.energy_j >= fast.lower_bound_j)
    for j in range(0, len(fast.time_s), 50):
        freqs = pipeline.frequencies_of(fast.choice[:, j])
        ev = evaluate(dense_profile, schedule, freqs, P_BLOCK)
        assert (ev.iteration_time_s, ev.energy_j) == (fast.time_s[j], fast.energy_j[j])
