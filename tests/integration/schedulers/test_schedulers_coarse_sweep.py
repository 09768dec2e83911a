"""The default (coarse-to-fine) sweep online: fewer rounds, and a plan as good as a complete
profile's, through the real coordinator."""

from __future__ import annotations

import pandas as pd
import pytest
from server_fixtures import GroundTruth, SimulatedJob, rank_infos, running_server

from perseus.domain.plan import Plan
from perseus.domain.profile import InstructionProfile
from perseus.domain.schedule import make_schedule
from perseus.io.plan_file import load_plan
from perseus.planning import evaluate_plan, solve_frontier
from perseus.settings import PerseusSettings

M = 4
IMBALANCED = [0.010, 0.016, 0.010, 0.012]
FREQS = list(range(1500, 450, -15))  # 71 levels: the GPU's clock step, as on real GPUs


def _complete_profile(truth: GroundTruth) -> InstructionProfile:
    rows = [
        (stage, kind, f, truth.time_s(stage, kind, f), truth.energy_j(stage, kind, f))
        for stage in range(len(truth.forward_s))
        for kind in ("forward", "backward")
        for f in FREQS
    ]
    return InstructionProfile.from_frame(
        pd.DataFrame(rows, columns=["stage", "instruction", "frequency", "time", "energy"])
    )


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
        scheduler_args={"num_microbatches": M, "warmup_rounds": 1, **args},
        dump_dir=str(tmp_path),
        dump_data=True,
    )
    truth = GroundTruth(IMBALANCED)
    with running_server(settings) as url:
        job = SimulatedJob(url, truth, pp=4, num_microbatches=M)
        job.infos = rank_infos(4, freqs=FREQS)
        history = job.run_sync(len(FREQS) + 3)
    plan = load_plan(tmp_path / job.job_id / "deployed_plan.json")
    return _rounds_until_deployed(history), plan


def test_the_coarse_sweep_deploys_within_half_a_percent_of_the_complete_profile_plan(tmp_path):
    truth = GroundTruth(IMBALANCED)
    complete = _complete_profile(truth)
    frontier = solve_frontier(complete, make_schedule("1f1b", 4, M), p2p_power_w=truth.p2p_power_w)

    rounds, plan = _run(tmp_path)  # the default sweep
    # A full sweep without early stop runs warm-up + every level; this one, under 60 % of it.
    assert rounds < 0.6 * (1 + len(FREQS)), rounds

    # The scheduler's prediction is the truth (the sweep measured the true numbers) ...
    true = evaluate_plan(complete, plan)
    assert plan.energy == pytest.approx(true.energy_j, rel=1e-9)
    # ... and within 0.5 % of the complete profile's cheapest plan at the same time.
    reference = frontier.choose(deadline_s=plan.iteration_time)
    assert plan.energy <= 1.005 * reference.energy_j, (plan.energy, reference.energy_j)
