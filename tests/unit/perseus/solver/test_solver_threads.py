"""The frontier's rounding ways run in threads of their own: the frontier must not depend on
how many, and each batch cut to its own Pareto front must merge to the same set."""

from __future__ import annotations

import numpy as np
import pytest
from paths import SHARED_DATA, require_data

import perseus.solver.frontier as frontier_module
from perseus.domain.profile import InstructionProfile
from perseus.domain.schedule import make_schedule
from perseus.errors import SolverError
from perseus.io.profile_csv import load_profile
from perseus.planning import PipelineProblem
from perseus.solver import compute_frontier
from perseus.solver.pareto import ParetoStore, pareto_front
from perseus.synth import synthesize_profile


def _real() -> InstructionProfile:
    return load_profile(require_data(SHARED_DATA / "sosp24_gpt3-175b_a40_8stage.csv"))


def _dense() -> InstructionProfile:
    frame = synthesize_profile("H100-SXM", [1.0, 1.1, 0.9, 0.8])
    return InstructionProfile.from_frame(frame, source="synth-h100")


@pytest.mark.parametrize(
    ("make_profile", "schedule", "power_w"),
    [
        (_real, make_schedule("1f1b", 8, 6), 70.38),  # measured: four rounding ways
        (_dense, make_schedule("1f1b", 4, 6), 119.0),  # model-made: two
    ],
)
def test_the_frontier_is_the_same_with_one_thread_or_several(
    make_profile, schedule, power_w, monkeypatch
):
    problem = PipelineProblem(make_profile(), schedule, power_w).solver
    # Small batches: several LP batches, each mixed from the one before.
    monkeypatch.setattr(frontier_module, "_BATCH", 48)
    one = compute_frontier(problem, max_points=None, threads=1)
    for threads in (2, 4):
        many = compute_frontier(problem, max_points=None, threads=threads)
        np.testing.assert_array_equal(many.time_s, one.time_s)
        np.testing.assert_array_equal(many.energy_j, one.energy_j)
        np.testing.assert_array_equal(many.choice, one.choice)
        assert many.stats["candidates"] == one.stats["candidates"]


def test_threads_must_be_positive():
    problem = PipelineProblem(_real(), make_schedule("1f1b", 8, 2), 70.38).solver
    with pytest.raises(SolverError, match="threads must be at least 1"):
        compute_frontier(problem, threads=0)


def test_a_batch_cut_to_its_own_front_merges_to_the_same_pareto_set():
    rng = np.random.default_rng(7)
    n = 5
    for _ in range(50):
        store_all, store_cut = ParetoStore(n, 1.0), ParetoStore(n, 1.0)
        for _batch in range(3):
            k = int(rng.integers(1, 40))
            # Coarse values: many ties in time, in energy and in both.
            t = rng.integers(0, 12, k) / 4.0 + 0.5  # some below the floor
            e = rng.integers(0, 12, k) / 4.0
            choice = rng.integers(0, 30, (n, k))
            store_all.add(t, e, e / 2, choice)
            front = pareto_front(t, e, 1.0)
            assert np.all(np.diff(t[front]) > 0) and np.all(np.diff(e[front]) < 0)
            assert np.all(t[front] >= 1.0)
            store_cut.add(t[front], e[front], e[front] / 2, choice[:, front])
        np.testing.assert_array_equal(store_cut.time, store_all.time)
        np.testing.assert_array_equal(store_cut.energy, store_all.energy)
        np.testing.assert_array_equal(store_cut.choice, store_all.choice)
