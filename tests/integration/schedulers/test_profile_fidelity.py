"""The online profile over a small seeded family of jobs nobody tuned for, in virtual time.

`benchmarks/bench_profile_fidelity.py`'s job 2 of seed 0 (zero bubble 2 × 2, 1.5 ms forwards:
short instructions in few windows, where the per-unit fit before the curve erred 3.3 / 13 %): each job runs through the real `Perseus` scheduler (all-max rounds,
sweep, energy-window estimator, checks, planner, guard) fed by simulated ranks on emulated
A40s whose curves are drawn around the published A40 profiles, with the real-like sensors
(100 ms, 25 % sampled), timing jitter, power that decays after work stops, and drift.
"""

from __future__ import annotations

import sys

import pytest
from paths import REPO, require_data

sys.path.insert(0, str(REPO / "benchmarks"))
import bench_profile_fidelity as bench
import fidelity_family


@pytest.fixture(scope="module")
def family():
    require_data(fidelity_family.data_dir() / "sosp24_gpt3-175b_a40_8stage.csv")
    args = bench.parser().parse_args(
        ["--jobs", "1", "--start", "2", "--max-ranks", "6", "--guard-rounds", "2", "--quiet"]
    )
    return bench.run_family(args)


def test_every_job_of_the_family_profiles(family):
    results, fig = family
    assert fig["failed"] == 0, [r.failed for r in results]
    assert fig["rows"] > 50


def test_no_row_a_gpu_cannot_draw_reaches_the_profile(family):
    _, fig = family
    assert fig["unphysical"] == 0, fig


def test_energy_errors_and_their_stated_uncertainty(family):
    _, fig = family
    e = fig["energy_err"]
    assert e["median"] <= 0.015 and e["p95"] <= 0.06, e
    assert fig["coverage"] >= 0.9, fig["coverage"]


def test_plans_from_the_profile_cost_what_the_truths_would(family):
    _, fig = family
    at_1 = fig["regret"]["0.01"]
    assert at_1["median"] <= 0.005, fig["regret"]
    if fig["deployed"]:
        assert fig["saving_gap_points"]["median"] <= 2.0, fig["saving_gap_points"]
