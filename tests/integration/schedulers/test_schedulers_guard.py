"""The Perseus loop's promise, measured: the real scheduler on emulated GPUs in virtual time.

`perseus.demo.virtual.VirtualCluster` runs the job (emulated A100s switching clocks in
15 ms, a P2P hop latency and host gaps the profile does not hold); the `Perseus` scheduler
profiles or reads a profile, calibrates its costs, deploys and guards its plan.
"""

from __future__ import annotations

import json

import pytest

from perseus.demo.virtual import VirtualCluster, run_rounds
from perseus.domain.profile import InstructionProfile
from perseus.domain.robust import window_medians
from perseus.domain.schedule import make_schedule
from perseus.io.profile_csv import save_profile
from perseus.schedulers.base import build_scheduler
from perseus.schedulers.perseus_scheduler.guard import COOLDOWN_ROUNDS, GuardState
from perseus.schedulers.perseus_scheduler.scheduler import Perseus, PerseusPhase
from perseus.settings import PerseusSettings
from perseus.synth import stage_workloads, synthesize_profile

GPU = "A100-SXM"
S, M = 4, 8
WORK = [1.0, 1.6, 1.0, 1.2]
BUDGET = 0.01


def cluster(**kw) -> VirtualCluster:
    pipeline = make_schedule("1f1b", S, M)
    pairs = stage_workloads(GPU, WORK, base_forward_ms=10.0)
    workloads = {}
    for stage, (fwd, bwd) in enumerate(pairs):
        workloads[stage, "forward"] = fwd
        workloads[stage, "backward"] = bwd
    kw.setdefault("hop_latency_s", 0.001)
    kw.setdefault("host_gap_s", 0.0002)
    return VirtualCluster(pipeline, workloads, gpu_type=GPU, **kw)


def scheduler(c: VirtualCluster, tmp_path, *, dump_data: bool = False, **args) -> Perseus:
    settings = PerseusSettings(scheduler="Perseus", dump_dir=str(tmp_path), dump_data=dump_data)
    s = build_scheduler(
        Perseus, c.job_record(), c.rank_infos(), settings, {"max_slowdown": BUDGET, **args}
    )
    assert isinstance(s, Perseus)
    return s


def profile_csv(tmp_path, scale: dict[int, float] | None = None) -> str:
    """The emulator's exact profile, stage times (and energies) scaled by `scale`."""
    frame = synthesize_profile(GPU, stage_workloads(GPU, WORK, base_forward_ms=10.0))
    for stage, factor in (scale or {}).items():
        rows = frame["stage"] == stage
        frame.loc[rows, ["time", "energy"]] *= factor
    path = tmp_path / "profile.csv"
    save_profile(InstructionProfile.from_frame(frame), path)
    return str(path)


def measured(s: Perseus, rounds: list[int]) -> tuple[float, float]:
    """(slowdown, saving) of `rounds` of the running plan against the all-max medians: the
    statistic the guard and the report use (`perseus.domain.robust`)."""
    mine = [r for r in s.promise.plan_rounds if r.round in rounds]
    t0, e0 = window_medians(
        [r.iteration_time_s for r in s.baseline], [r.energy_j for r in s.baseline]
    )
    t, e = window_medians([r.iteration_time_s for r in mine], [r.energy_j for r in mine])
    return t / t0 - 1, 1 - e / e0


def test_a_plan_from_the_true_profile_keeps_its_promise_and_is_kept(tmp_path):
    c = cluster()
    p2p = c.gpus[0].p2p_block_power_w
    s = scheduler(c, tmp_path, profile_path=profile_csv(tmp_path), p2p_power=p2p)
    run_rounds(s, c, 20)
    assert s.phase is PerseusPhase.DEPLOYED
    assert s.costs is not None and s.costs.switch_source == "measured"
    assert s.costs.switch_latency_s == pytest.approx(0.015, abs=2e-4)
    assert s.costs.hop_latency_s > 0  # the injected hops and host gaps, calibrated
    events = [e["event"] for e in s.promise_events()]
    assert events[:2] == ["deployed", "check"] and "move" not in events
    slowdown, saving = measured(s, list(range(s.promise.plan_since + 1, s._round + 1)))
    predicted_saving, predicted_slowdown = s._predicted(s.chosen)
    assert slowdown <= BUDGET + 1e-3
    assert saving > 0.02
    assert saving == pytest.approx(predicted_saving, abs=0.01)
    assert slowdown == pytest.approx(predicted_slowdown, abs=0.005)


def test_a_wrong_profile_is_stepped_back_within_the_bound_and_never_oscillates(tmp_path):
    c = cluster()
    p2p = c.gpus[0].p2p_block_power_w
    # The critical stage profiled 25 % faster than it runs: the plan spends slack it lacks.
    wrong = profile_csv(tmp_path, scale={1: 0.75})
    s = scheduler(c, tmp_path, profile_path=wrong, p2p_power=p2p, guard_window=4)
    history = run_rounds(s, c, 40)
    events = s.promise_events()
    # One deployment's moves (a fall-back's re-deployment after its cool-down starts another).
    redeployed = [e["round"] for e in events if e["event"] == "redeploy"]
    if redeployed:
        events = [e for e in events if e["round"] < redeployed[0]]
        history = history[: redeployed[0]]
    deployed = next(e for e in events if e["event"] == "deployed")
    moves = [e for e in events if e["event"] in ("move", "fallback")]
    assert moves, events
    window = s.guard.window
    bound = deployed["round"] + 2 * (1 + 3 * window)
    assert all(m["round"] <= bound for m in moves)
    # Moves only go towards plans predicted faster against all-max (all-max last, at 0),
    # then nothing changes.
    slowdowns = [e["predicted_slowdown"] for e in [deployed, *moves]]
    assert slowdowns == sorted(slowdowns, reverse=True) and len(set(slowdowns)) == len(slowdowns)
    last = moves[-1]["round"]
    plans = [[x.frequencies for x in round_] for round_ in history[last + 1 :]]
    assert len(plans) >= 15
    # The plan stays; every reference_every-th round of it runs all-max (the guard's
    # reference), unless the guard fell back to all-max itself.
    all_max = [x.frequencies for x in history[0]]
    others = [p for p in plans if p != all_max]
    assert all(p == others[0] for p in others)
    if moves[-1]["event"] == "move":
        assert len(plans) - len(others) <= len(plans) // s.reference_every + 1
    slowdown, _ = measured(s, list(range(last + 2, s._round + 1)))
    tol, _ = s.guard.tolerances(window)
    assert slowdown <= BUDGET + tol


def test_the_plan_runs_from_the_round_it_is_deployed_in(tmp_path):
    c = cluster()
    s = scheduler(c, tmp_path, profile_path=profile_csv(tmp_path))
    history = run_rounds(s, c, 8)
    (deployed,) = [e for e in s.promise_events() if e["event"] == "deployed"]
    # Warm-up and 4 baseline rounds at all-max (the profile is given, and so the blocking
    # power they measured is all the sweep would add), then the plan at once.
    assert deployed["round"] == 1 + s.baseline_rounds
    top = c.gpus[0].supported_sm_clocks_mhz()[0]
    ran = history[deployed["round"]]
    assert any(f < top for x in ran for _, f in x.frequencies)
    assert s.promise.plan_since == deployed["round"]
    assert s.p2p_power_w == pytest.approx(c.gpus[0].p2p_block_power_w, rel=0.01)


def test_instructions_too_short_are_planned_per_stage_without_an_instruction_sweep(tmp_path):
    """The all-max rounds show instructions too short to plan one by one: no instruction is
    swept; the stages' clocks are (`perseus.schedulers.perseus_scheduler.stage_clocks`, its own tests), and the
    decision that follows says the plans are per stage and why."""
    pipeline = make_schedule("1f1b", S, M)
    pairs = stage_workloads(GPU, WORK, base_forward_ms=0.4)  # sub-ms, as a tiny model's
    workloads = {}
    for stage, (fwd, bwd) in enumerate(pairs):
        workloads[stage, "forward"] = fwd
        workloads[stage, "backward"] = bwd
    c = VirtualCluster(pipeline, workloads, gpu_type=GPU, hop_latency_s=0.001)
    s = scheduler(c, tmp_path)
    lead_in = 1 + s.baseline_rounds
    history = run_rounds(s, c, lead_in + 14)
    assert s.per_stage and s.phase is not PerseusPhase.PROFILING
    (decided,) = [e for e in s.promise_events() if e["event"] in ("deployed", "held")]
    assert "too short" in decided["reason"] and "per-stage" in decided["reason"]
    assert decided["round"] == lead_in + len(s.stage_sweep.rounds)
    top = c.gpus[0].supported_sm_clocks_mhz()[0]
    assert all(f == top for round_ in history[:lead_in] for x in round_ for _, f in x.frequencies)
    # One clock per rank in every round (no switch within an iteration), lower ones after
    # the all-max rounds.
    assert all(len({f for _, f in x.frequencies}) == 1 for round_ in history for x in round_)
    assert any(f < top for x in history[lead_in] for _, f in x.frequencies)


def test_a_profile_row_whose_fit_implies_no_gpus_power_is_left_out(tmp_path):
    """The energy windows' fit can put a clock of a kind at (or near) zero power when the
    windows cannot tell it from its neighbours; such a row (below 1 W, which our own profile
    loader refuses as a unit mistake) is left out of the profile, not written for the plan
    to trust. The max clock's row is always kept."""
    from perseus.domain.profile import check_implied_power
    from perseus.domain.rows import ProfileRow

    c = cluster()
    infos = [r.model_copy(update={"energy_refresh_s": 0.1}) for r in c.rank_infos()]
    settings = PerseusSettings(scheduler="Perseus", dump_dir=str(tmp_path))
    s = build_scheduler(Perseus, c.job_record(), infos, settings, {"max_slowdown": BUDGET})
    assert isinstance(s, Perseus) and s.sweep.estimates.windows

    def row(freq: int, energy_j: float) -> ProfileRow:
        return ProfileRow(0, 0, 0, 0, 0, "forward", freq, 0.02, energy_j, True, False, 0.0)

    rows = [row(1410, 6.0), row(1200, 0.016), row(1005, 0.0), row(900, 4.0)]
    kept = s.sweep.estimates.annotate(rows)
    assert [(r.frequency, r.estimated) for r in kept] == [(1410, True), (900, True)]
    columns = [[getattr(r, c) for r in kept] for c in ("stage", "instruction", "frequency")]
    times, energies = ([getattr(r, c) for r in kept] for c in ("time", "energy"))
    check_implied_power(*columns, times, energies, source="kept")  # the loader's check


def _plan_args(c: VirtualCluster, tmp_path) -> dict:
    return {"profile_path": profile_csv(tmp_path), "p2p_power": c.gpus[0].p2p_block_power_w}


def test_a_fall_back_after_a_disturbance_is_not_for_life(tmp_path):
    """Issue 49's case: a disturbed stretch (the pipeline 15 % slow: a neighbour's job, a
    thermal swing) sends the plan back to all-max; after the cool-down's fresh all-max
    rounds the plan is re-deployed, watched again and kept (it was the old guard's end)."""
    c = cluster()
    s = scheduler(c, tmp_path, **_plan_args(c, tmp_path))
    run_rounds(s, c, 16)
    events = s.promise_events()
    assert [e["event"] for e in events][:2] == ["deployed", "check"], events
    promised = s.chosen.frequencies
    c.slowdown = {0: 1.15}
    for _ in range(40):
        run_rounds(s, c, 1)
        events += s.promise_events()
        if events[-1]["event"] == "fallback":
            break
    fallback = events[-1]
    assert fallback["event"] == "fallback", events
    assert fallback["cooldown_rounds"] == COOLDOWN_ROUNDS
    assert s.phase is PerseusPhase.ALL_MAX and s.guard.state is GuardState.COOLING
    c.slowdown = {}  # the disturbance is over
    run_rounds(s, c, COOLDOWN_ROUNDS + 1 + s.guard.window + 2)
    events += s.promise_events()
    (redeploy,) = [e for e in events if e["event"] == "redeploy"]
    assert redeploy["round"] == fallback["round"] + COOLDOWN_ROUNDS, (fallback, redeploy)
    after = [e for e in events if e["round"] > redeploy["round"]]
    assert after and all(e["event"] == "check" for e in after), after
    assert "keeps the plan" in after[0]["reason"]
    assert s.phase is PerseusPhase.DEPLOYED and s.chosen.frequencies == promised
    # The record on disk says the same, in order.
    on_disk = [json.loads(x)["event"] for x in s.job_dir.promise.read_text().splitlines()]
    assert on_disk.index("redeploy") > on_disk.index("fallback")


def test_a_restarted_coordinator_re_arms_the_guard_from_the_dump(tmp_path):
    c = cluster()
    s = scheduler(c, tmp_path, dump_data=True, **_plan_args(c, tmp_path))
    run_rounds(s, c, 16)
    assert s.phase is PerseusPhase.DEPLOYED and s.guard.state is GuardState.KEPT
    saved = json.loads(s.job_dir.guard.read_text())
    assert saved["guard"]["state"] == "kept"
    assert len(saved["guard"]["baseline"]) >= s.baseline_rounds
    # A new coordinator process: the same job's scheduler built again and resumed.
    r = scheduler(c, tmp_path, dump_data=True, **_plan_args(c, tmp_path))
    r.resume(s.chosen)
    assert r.promise.guarded and r.phase is PerseusPhase.DEPLOYED
    assert [f.round for f in r.baseline] == [b[0] for b in saved["guard"]["baseline"]]
    assert r.guard.state is GuardState.SETTLING
    run_rounds(r, c, 1 + r.guard.window + 2)
    events = r.promise_events()
    assert events[0]["event"] == "resumed" and "checks the plan again" in events[0]["reason"]
    checks = [e for e in events if e["event"] == "check"]
    assert checks and "keeps the plan" in checks[0]["reason"], events
    assert checks[0]["round"] > saved["round"]  # round numbers go on


def test_a_restarted_coordinator_predicts_with_the_power_after_work_stops_it_found(
    tmp_path, caplog
):
    """The shares of power the GPUs draw after their work stops, which the profile's fit
    found, are in the job's ``profiling.json``; a restarted coordinator scores plans with
    them as the one before did, and one that cannot read them says so and leaves them out."""
    from perseus.planning import AfterWork

    c = cluster()
    s = scheduler(c, tmp_path, dump_data=True, **_plan_args(c, tmp_path))
    run_rounds(s, c, 8)
    assert s.phase is PerseusPhase.DEPLOYED and s.model is not None
    plain, _ = s.model.predicted(s.chosen)
    shares = {str(r): [0.9, 0.5, 0.1] for r in range(S)}
    s.job_dir.profiling.write_text(json.dumps({"rounds": 3, "after_work_shares": shares}))
    r = scheduler(c, tmp_path, dump_data=True, **_plan_args(c, tmp_path))
    r.resume(s.chosen)
    assert r.model is not None and r.model.after_work == AfterWork.from_json(shares)
    with_tails, _ = r.model.predicted(s.chosen)
    assert with_tails != pytest.approx(plain, abs=1e-4)  # the bubbles' decay is saved too
    s.job_dir.profiling.write_text(json.dumps({"after_work_shares": {"0": [7.0]}}))
    again = scheduler(c, tmp_path, dump_data=True, **_plan_args(c, tmp_path))
    again.resume(s.chosen)
    assert again.model is not None and again.model.after_work is None
    assert "after-work shares" in caplog.text and "unreadable" in caplog.text


def test_a_dump_without_the_guards_state_re_measures_all_max_then_checks(tmp_path):
    c = cluster()
    s = scheduler(c, tmp_path, dump_data=True, **_plan_args(c, tmp_path))
    history = run_rounds(s, c, 8)
    top = [x.frequencies for x in history[0]]  # round 0 runs all-max
    s.job_dir.guard.unlink()  # a dump written before guard.json existed
    r = scheduler(c, tmp_path, dump_data=True, **_plan_args(c, tmp_path))
    r.resume(s.chosen)
    assert r.promise.guarded and len(r.baseline) == 0
    history = run_rounds(r, c, r.baseline_rounds + 1 + r.guard.window + 2)
    ran = [[x.frequencies for x in round_] for round_ in history]
    assert ran[: r.baseline_rounds] == [top] * r.baseline_rounds  # all-max measured again
    assert ran[r.baseline_rounds] != top
    events = r.promise_events()
    assert events[0]["event"] == "resumed" and "re-measures" in events[0]["reason"]
    assert any(e["event"] == "check" for e in events), events
    assert r.job_dir.guard.is_file()  # and written from now on


def test_a_restart_during_the_cool_down_goes_on_cooling_then_re_deploys(tmp_path):
    c = cluster()
    s = scheduler(c, tmp_path, dump_data=True, **_plan_args(c, tmp_path))
    run_rounds(s, c, 16)
    promised = s.chosen.frequencies
    c.slowdown = {0: 1.15}
    for _ in range(40):
        run_rounds(s, c, 1)
        if s.guard.cooling:
            break
    assert s.guard.cooling and s.phase is PerseusPhase.ALL_MAX
    c.slowdown = {}
    run_rounds(s, c, 5)
    saved = json.loads(s.job_dir.guard.read_text())["guard"]
    assert saved["state"] == "cooling" and saved["cooldown_left"] >= s.guard.cooldown_left
    all_max = s.chosen  # what the dump's deployed_plan.json holds during a cool-down
    r = scheduler(c, tmp_path, dump_data=True, **_plan_args(c, tmp_path))
    r.resume(all_max)
    assert r.phase is PerseusPhase.ALL_MAX and r.guard.cooling
    assert r.guard.cooldown_left == saved["cooldown_left"] and r.guard.fallbacks == 1
    run_rounds(r, c, saved["cooldown_left"] + 1 + r.guard.window + 2)
    events = [e["event"] for e in r.promise_events()]
    assert events[0] == "resumed" and "redeploy" in events, events
    assert events[events.index("redeploy") + 1 :] and r.phase is PerseusPhase.DEPLOYED
    assert r.chosen.frequencies == promised
    # A dump without guard.json whose plan is all-max (held, or fallen back, before the
    # restart): all-max stays, as before guard.json existed.
    r.job_dir.guard.unlink()
    q = scheduler(c, tmp_path, dump_data=True, **_plan_args(c, tmp_path))
    q.resume(all_max)
    assert q.phase is PerseusPhase.ALL_MAX and q.guard.state is GuardState.ALL_MAX
    top = c.gpus[0].supported_sm_clocks_mhz()[0]
    ran = run_rounds(q, c, COOLDOWN_ROUNDS + 2)
    assert all(f == top for round_ in ran for x in round_ for _, f in x.frequencies)
    assert not [e for e in q.promise_events() if e["event"] == "redeploy"]


def test_gpus_that_drift_from_the_profile_are_profiled_again(tmp_path):
    """Issue 49: the GPUs' busy power drifts (as the H200 did, 7 % a day; here 50 % an hour
    and 20 virtual minutes at once). The all-max reference rounds show it; past the
    threshold the job is profiled again (``reprofile``), online since the given profile no
    longer describes the GPUs, and the new profile's plan is deployed and checked. Without
    drift nothing happens; with the threshold at 0 the job never re-profiles."""

    def run(drift: float, threshold: float) -> Perseus:
        c = cluster()
        p2p = c.gpus[0].p2p_block_power_w
        s = scheduler(
            c,
            tmp_path / f"{drift}-{threshold}",
            profile_path=profile_csv(tmp_path),
            p2p_power=p2p,
            reference_every=2,
            reprofile_drift=threshold,
        )
        run_rounds(s, c, 20)
        assert s.phase is PerseusPhase.DEPLOYED and s.drift.reference is not None
        for gpu, clock in zip(c.gpus, c.clocks, strict=True):
            gpu.power_drift_per_hour = drift
            clock.advance(1200.0)
        run_rounds(s, c, 200, on_round=lambda *_: None)
        return s

    s = run(0.5, 0.05)
    taken = s.promise.story.take_events()
    events = [e for e in taken if e["event"] in ("reprofile", "deployed")]
    kinds = [e["event"] for e in events]
    assert "reprofile" in kinds, kinds
    first = kinds.index("reprofile")
    assert "energy per iteration +" in events[first]["reason"], events[first]
    assert "deployed" in kinds[first + 1 :], kinds  # the new profile's plan
    assert s.phase is PerseusPhase.DEPLOYED
    assert s.sweep is not None and s.sweep.done  # measured online this time
    for steady in (run(0.0, 0.05), run(0.5, 0.0)):
        assert "reprofile" not in [e["event"] for e in steady.promise.story.take_events()]


def test_a_failed_solve_is_tried_again_after_a_back_off(tmp_path):
    """Issue 49: a solve that fails (here: over its memory limit) holds all-max with its
    reason and is tried again SOLVE_RETRY_ROUNDS later; once it can succeed (the limit
    raised, as memory freed by other jobs' solves would) the job deploys its plan."""
    from perseus.schedulers.perseus_scheduler.solving import SOLVE_RETRY_ROUNDS

    c = cluster()
    settings = PerseusSettings(scheduler="Perseus", dump_dir=str(tmp_path), solve_memory_mb=1)
    args = {
        "max_slowdown": BUDGET,
        "profile_path": profile_csv(tmp_path),
        "p2p_power": c.gpus[0].p2p_block_power_w,
    }
    s = build_scheduler(Perseus, c.job_record(), c.rank_infos(), settings, args)
    assert isinstance(s, Perseus)
    run_rounds(s, c, 10)
    events = s.promise.story.take_events()
    failed = [e for e in events if e["event"] == "solve_failed"]
    assert len(failed) == 1 and failed[0]["retry_in_rounds"] == SOLVE_RETRY_ROUNDS, events
    assert s.phase is PerseusPhase.ALL_MAX
    run_rounds(s, c, SOLVE_RETRY_ROUNDS)  # still too little memory: tried again, longer
    failed = [e for e in s.promise.story.take_events() if e["event"] == "solve_failed"]
    assert [e["retry_in_rounds"] for e in failed] == [2 * SOLVE_RETRY_ROUNDS], failed
    s.settings = settings.model_copy(update={"solve_memory_mb": 4096})
    run_rounds(s, c, 2 * SOLVE_RETRY_ROUNDS + 5)
    assert "deployed" in [e["event"] for e in s.promise.story.take_events()]
    assert s.phase is PerseusPhase.DEPLOYED
