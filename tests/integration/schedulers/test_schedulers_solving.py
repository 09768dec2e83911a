"""A big frontier is solved in a process of its own (`perseus.schedulers.perseus_scheduler.solving`): all-max rounds
go on meanwhile, so no rank waits on the solve, and the plan deployed after it is the plan
the solve in the round would have deployed. A frontier no point of which can be deployed
holds all-max, saying why, and the job goes on."""

from __future__ import annotations

import time

from test_schedulers_guard import cluster, profile_csv, scheduler

from perseus.demo.virtual import run_rounds
from perseus.schedulers.perseus_scheduler.scheduler import PerseusPhase

TIMEOUT_S = 120
ROUND_S = 0.005
"""A real round takes time (an iteration of training); these virtual ones take a few ms of
Python. Each round here lasts at least this long, as a real one would."""


def _max_mhz(schedules) -> set[int]:
    return {f for sch in schedules for _, f in sch.frequencies}


def test_the_solve_runs_beside_all_max_rounds_and_deploys_the_same_plan(tmp_path):
    c = cluster()
    p2p = c.gpus[0].p2p_block_power_w
    given = {"profile_path": profile_csv(tmp_path), "p2p_power": p2p}
    inline = scheduler(c, tmp_path / "inline", **given)
    run_rounds(inline, c, 12)
    assert inline.phase is PerseusPhase.DEPLOYED
    assert inline.chosen is not None

    c = cluster()
    s = scheduler(c, tmp_path / "thread", **given, solve_on_thread_above=0)
    started = None
    issued = []
    t0, k = time.monotonic(), 0
    while time.monotonic() - t0 < TIMEOUT_S:
        schedules = s.next_schedule()
        issued.append(schedules)
        if started is None and s.deployer.solve is not None:
            started = k
            # The round that started the solve did not wait for it: it runs all-max.
            assert s.deployer.solve.on_thread and s.phase is PerseusPhase.PROFILING
            assert _max_mhz(schedules) == {1410}
        s.observe(c.run_round(schedules))
        time.sleep(ROUND_S)
        k += 1
        if s.phase is PerseusPhase.DEPLOYED:
            break
    assert started is not None and s.phase is PerseusPhase.DEPLOYED
    deployed = [e for e in s.promise_events() if e["event"] == "deployed"]
    assert len(deployed) == 1 and deployed[0]["round"] > started
    # Every round between the start and the deployment ran all-max.
    for schedules in issued[started : deployed[0]["round"]]:
        assert _max_mhz(schedules) == {1410}
    # Solved on the thread or in the round: the same frontier, the same choice.
    assert s.chosen is not None
    assert s.chosen.frequencies == inline.chosen.frequencies
    assert s.chosen.energy == inline.chosen.energy


def test_a_job_given_everything_registers_before_its_solve_ends(tmp_path):
    c = cluster()
    given = {"profile_path": profile_csv(tmp_path), "p2p_power": c.gpus[0].p2p_block_power_w}
    # No all-max rounds: the solve starts at registration, on its thread.
    s = scheduler(c, tmp_path, **given, baseline_rounds=0, solve_on_thread_above=0)
    assert (
        s.phase is PerseusPhase.PROFILING
        and s.deployer.solve is not None
        and s.deployer.solve.on_thread
    )
    schedules = s.next_schedule()
    assert _max_mhz(schedules) == {1410}
    t0 = time.monotonic()
    while time.monotonic() - t0 < TIMEOUT_S:
        if s.phase is PerseusPhase.DEPLOYED:
            break
        s.observe(c.run_round(schedules))
        time.sleep(ROUND_S)
        schedules = s.next_schedule()
    assert s.phase is PerseusPhase.DEPLOYED


def test_a_deadline_no_plan_meets_holds_all_max_and_the_job_goes_on(tmp_path):
    c = cluster()
    given = {"profile_path": profile_csv(tmp_path), "p2p_power": c.gpus[0].p2p_block_power_w}
    s = scheduler(c, tmp_path, **given, deadline=1e-6)
    run_rounds(s, c, 12)  # no exception: the round that solved held all-max
    assert s.phase is PerseusPhase.ALL_MAX
    held = [e for e in s.promise_events() if e["event"] == "held"]
    assert len(held) == 1 and "no frontier point to deploy" in held[0]["reason"]
    assert "No plan meets an iteration time of 0.000001 s" in held[0]["reason"]
    assert _max_mhz(s.next_schedule()) == {1410}
