"""A job whose instructions are too short to plan one by one, through the real `Perseus`
scheduler in virtual time: per-stage constant clocks.

Four ranks of 1F1B (8 microbatches) on emulated A100s with real-like sensors (a counter
refreshing every 100 ms, 1 % noise) and 5 % timing jitter (`benchmarks/sensor_ranks.py`):
the stages are uneven (1 : 1.6 : 1.3 : 0.7) and their forwards last 0.22-0.5 ms at the max
clock. The all-max rounds show the instructions too short (`perseus.schedulers.perseus_scheduler.checks`), so no
instruction is swept: the stages' clocks are (`perseus.schedulers.perseus_scheduler.stage_clocks`), and the plan that
runs every instruction of a stage at one clock is deployed and guarded. Its saving and
slowdown are then scored on the truth (the emulator's own times and powers), which the
scheduler never sees.
"""

from __future__ import annotations

import json
import sys

import pytest
from paths import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from sensor_ranks import Ranks, dvfs_truth

from perseus.domain.schedule import make_schedule
from perseus.planning import evaluate
from perseus.schedulers.base import build_scheduler
from perseus.schedulers.perseus_scheduler.scheduler import Perseus, PerseusPhase
from perseus.settings import PerseusSettings
from zeus_power.device import SensorSpec

BUDGET = 0.02
FORWARD_MS = 0.5
SCHEDULE = make_schedule("1f1b", 4, 8)
# Rounds of 5 refreshes (7 with the partial ones at both ends) instead of 10: half the
# virtual time, the same figures within the guard's tolerance.
ARGS = {"max_slowdown": BUDGET, "round_ticks": 5}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    sensors = SensorSpec(period_s=0.1, window=1.0, read_latency_s=0.0, noise=0.01)
    ranks = Ranks(SCHEDULE, dvfs_truth(FORWARD_MS), sensors, seed=3, jitter=0.05)
    dump = tmp_path_factory.mktemp("stage-clocks")
    settings = PerseusSettings(scheduler="Perseus", scheduler_args=ARGS, dump_dir=str(dump))
    s = build_scheduler(Perseus, ranks.job_info("short"), ranks.rank_infos(), settings, ARGS)
    assert isinstance(s, Perseus)
    issued = []
    for _ in range(40):
        schedules = s.next_schedule()
        issued.append([x.frequencies for x in schedules])
        s.observe(ranks.run(schedules)[0])
        if s.phase is not PerseusPhase.PROFILING and s._round >= s.promise.plan_since + 8:
            break
    return s, ranks, issued, s.promise_events()


def _true_figures(ranks: Ranks, freqs: list[list[int]]) -> tuple[float, float]:
    """(saving, slowdown) of `freqs` against all-max, scored on the emulator's truth."""
    top = max(ranks.frequencies)
    all_max = [[top] * len(f) for f in freqs]
    keys = {
        (i.stage, i.kind, f)
        for plan in (freqs, all_max)
        for order, clocks in zip(SCHEDULE.orders, plan, strict=True)
        for i, f in zip(order, clocks, strict=True)
    }
    truth = ranks.truth_profile(keys)
    idle = ranks.gpus[0].idle_power_w
    base = evaluate(truth, SCHEDULE, all_max, idle)
    plan = evaluate(truth, SCHEDULE, freqs, idle)
    return 1 - plan.energy_j / base.energy_j, plan.iteration_time_s / base.iteration_time_s - 1


def test_no_instruction_is_swept_only_stages(job):
    s, _, issued, _ = job
    assert s.per_stage and s.stage_sweep is not None and s.stage_sweep.done
    # Every round ran one clock per rank (no switch within an iteration), and some ran
    # lower clocks: the per-stage rounds, not an instruction sweep.
    for round_ in issued:
        assert all(len({f for _, f in rank}) == 1 for rank in round_)
    clocks = {f for round_ in issued for rank in round_ for _, f in rank}
    assert len(clocks) >= 5


def test_a_per_stage_plan_is_deployed_that_saves_within_its_budget_on_the_truth(job):
    s, ranks, _, events = job
    deployed = [e for e in events if e["event"] == "deployed"]
    assert len(deployed) == 1, events
    assert "per-stage plan" in deployed[0]["reason"] and "too short" in deployed[0]["reason"]
    assert not [e for e in events if e["event"] in ("held", "fallback")], events
    assert s.phase is PerseusPhase.DEPLOYED and s.chosen is not None
    freqs = s.chosen.stage_frequencies()
    assert all(len(set(f)) == 1 for f in freqs)
    assert freqs[1][0] == max(ranks.frequencies)  # the heaviest stage sets the pace
    assert min(f[0] for f in freqs) < max(ranks.frequencies)
    predicted_saving, predicted_slowdown = s._predicted(s.chosen)
    assert predicted_slowdown <= BUDGET + 1e-9
    saving, slowdown = _true_figures(ranks, freqs)
    assert saving > 0.05, (saving, predicted_saving)
    assert slowdown <= BUDGET, (slowdown, predicted_slowdown)
    assert saving == pytest.approx(predicted_saving, abs=0.03)
    assert slowdown == pytest.approx(predicted_slowdown, abs=0.005)


def test_the_guard_watches_the_plan_and_keeps_it(job):
    """Like any plan: its rounds are measured against the all-max ones, and it keeps its
    budget within the guard's tolerance."""
    *_, events = job
    checks = [e for e in events if e["event"] == "check"]
    assert checks, events
    for check in checks:
        assert "keeps the plan" in check["reason"], check
        assert check["measured_slowdown"] <= BUDGET + check["slowdown_tolerance"]
        assert check["measured_saving"] > 0


def test_profiling_json_says_the_plan_is_per_stage(job):
    s, _, _, _ = job
    report = json.loads(s.job_dir.profiling.read_text())
    assert report["plan_kind"] == "per-stage"
    assert "too short" in report["per_stage_reason"]
    stages = report["stage_clocks"]
    assert [c["stage"] for c in stages] == [0, 1, 2, 3]
    for c in stages:
        assert c["frequencies"][0] == 1410 and len(c["frequencies"]) >= 4
        ratios = c["time_ratio"]
        assert ratios[0] == 1.0 and ratios == sorted(ratios) and ratios[-1] > 1.1
    assert report["rounds"] >= 4 + 12  # the all-max rounds and the per-stage rounds


def test_a_per_stage_plan_over_its_budget_falls_back_instead_of_moving(tmp_path):
    """A per-stage plan's time is the stages' measured sensitivity, which the guard's move
    (the frontier re-scored with a re-calibrated hop latency) does not hold: a plan found
    over budget goes to all-max for a cool-down, saying why, and is not replaced by a
    "faster" one whose prediction is unfounded."""
    from perseus.schedulers.perseus_scheduler.guard import GuardDecision

    sensors = SensorSpec(period_s=0.1, window=1.0, read_latency_s=0.0, noise=0.01)
    ranks = Ranks(SCHEDULE, dvfs_truth(FORWARD_MS), sensors, seed=3, jitter=0.05)
    settings = PerseusSettings(scheduler="Perseus", scheduler_args=ARGS, dump_dir=str(tmp_path))
    s = build_scheduler(Perseus, ranks.job_info("short"), ranks.rank_infos(), settings, ARGS)
    assert isinstance(s, Perseus)
    for _ in range(40):
        s.observe(ranks.run(s.next_schedule())[0])
        if s.phase is PerseusPhase.DEPLOYED:
            break
    assert s.per_stage and s.phase is PerseusPhase.DEPLOYED
    s._on_guard(
        GuardDecision("faster", "measured slowdown +12.00% is over the 2.00% budget",
                      0.12, 0.1, 0.01, 0.01, (s._round - 3, s._round))
    )  # fmt: skip
    assert s.phase is PerseusPhase.ALL_MAX
    events = s.promise_events()
    assert events[-1]["event"] == "fallback" and "move" not in [e["event"] for e in events]
    assert "a per-stage plan is not re-scored with measured costs" in events[-1]["reason"]
