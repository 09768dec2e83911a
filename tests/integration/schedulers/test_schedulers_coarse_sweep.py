"""The default (coarse-to-fine) sweep online: fewer rounds, and a plan as good as a complete
profile's, through the real coordinator, on emulated GPUs."""

from __future__ import annotations

import pytest
from server_fixtures import FREQS, GroundTruth, SimulatedJob, running_server, write_truth_profile

from perseus.domain.plan import Plan
from perseus.domain.schedule import make_schedule
from perseus.io.plan_file import load_plan
from perseus.io.profile_csv import load_profile
from perseus.planning import evaluate_plan, solve_frontier
from perseus.settings import PerseusSettings

M = 4
IMBALANCED = [0.010, 0.016, 0.010, 0.012]
ENERGY_REL = 3e-4
"""How close the plan's energy, scored on the sweep's measurements, comes to the same plan
scored on the emulator's exact profile: the energy counter counts whole millijoules, under
1 mJ of every instruction's ≥ 3.7 J (the blocking power is measured through it too)."""


def _rounds_until_deployed(history: list) -> int:
    deployed = history[-1]
    k = len(history)
    while k > 0 and history[k - 1] == deployed:
        k -= 1
    assert k < len(history) - 1, "the plan stays deployed"
    return k


def _run(tmp_path, **args) -> tuple[int, Plan]:
    settings = PerseusSettings(
        scheduler="Perseus",
        # Not about the all-max baseline: the plan is deployed once the sweep is done.
        scheduler_args={"num_microbatches": M, "warmup_rounds": 1, "baseline_rounds": 0, **args},
        dump_dir=str(tmp_path),
        dump_data=True,
    )
    truth = GroundTruth(IMBALANCED)
    with running_server(settings) as url:
        job = SimulatedJob(url, truth, pp=4, num_microbatches=M)
        history = job.run_sync(30)  # deployed from round 27
    assert [s.phase for s in job.statuses[-2:]] == ["deployed"] * 2
    plan = load_plan(tmp_path / job.job_id / "deployed_plan.json")
    return _rounds_until_deployed(history), plan


def test_the_coarse_sweep_deploys_within_half_a_percent_of_the_complete_profile_plan(tmp_path):
    truth = GroundTruth(IMBALANCED)
    complete = load_profile(write_truth_profile(truth, 4, tmp_path / "complete.csv"))
    frontier = solve_frontier(complete, make_schedule("1f1b", 4, M), p2p_power_w=truth.p2p_power_w)

    rounds, plan = _run(tmp_path)  # the default sweep
    # A full sweep without early stop runs warm-up + every level; this one, under 60 % of it.
    assert rounds < 0.6 * (1 + len(FREQS)), rounds

    # The scheduler's prediction is the truth (the sweep measured the true numbers) ...
    true = evaluate_plan(complete, plan)
    assert plan.iteration_time == pytest.approx(true.iteration_time_s, rel=1e-9)
    assert plan.energy == pytest.approx(true.energy_j, rel=ENERGY_REL)
    # ... and within 0.5 % of the complete profile's cheapest plan at the same time.
    reference = frontier.choose(deadline_s=plan.iteration_time)
    assert plan.energy <= 1.005 * reference.energy_j, (plan.energy, reference.energy_j)
