"""The frontier on the real GPT-3 and Bloom A40 profiles: shape, anchors, files, choosing,
bad input, and the fast end where the top clock is power-capped."""

from __future__ import annotations

import itertools
import json
import math

import networkx as nx
import numpy as np
import pandas as pd
import pytest
from paths import REPO, SHARED_DATA, require_data

import perseus.io.frontier_dir as frontier_dir
from perseus.domain.profile import InstructionProfile
from perseus.domain.schedule import make_schedule
from perseus.errors import PerseusError, PlanError, SolverError
from perseus.io.frontier_dir import FRONTIER_COLUMNS, FrontierRow, write_frontier_dir
from perseus.io.plan_file import load_plan, plan_text
from perseus.io.profile_csv import load_profile
from perseus.planning import (
    Frontier,
    FrontierPoint,
    evaluate,
    evaluate_plan,
    max_frequencies,
    solve_frontier,
)

P_BLOCK = 70.38


SHARED_PROFILE = SHARED_DATA / "sosp24_gpt3-175b_a40_8stage.csv"


@pytest.fixture(scope="module")
def real_profile() -> InstructionProfile:
    """The published GPT-3 A40 profile (module-scoped: several tests share one solve)."""
    return load_profile(require_data(SHARED_PROFILE))


@pytest.fixture(scope="module")
def frontier_8x8(real_profile):
    schedule = make_schedule("1f1b", 8, 8)
    seen: list[float] = []
    frontier = solve_frontier(
        real_profile, schedule, p2p_power_w=P_BLOCK, progress=seen.append, max_points=None
    )
    return schedule, frontier, seen


def test_frontier_is_monotone_and_scored_exactly(real_profile, frontier_8x8):
    schedule, frontier, _ = frontier_8x8
    times = np.array([p.iteration_time_s for p in frontier.points])
    energies = np.array([p.energy_j for p in frontier.points])
    bounds = np.array([p.lower_bound_j for p in frontier.points])
    assert len(frontier.points) > 50
    assert np.all(np.diff(times) > 0)
    assert np.all(np.diff(energies) < 0)
    assert np.all(bounds <= energies)
    # The LP bound is tight enough to mean something, and the plans are close to it.
    assert np.median(energies / bounds - 1) < 0.01
    for k in np.linspace(0, len(frontier.points) - 1, 6).astype(int):
        p = frontier.points[k]
        ev = evaluate(real_profile, schedule, p.frequencies, P_BLOCK)
        assert ev.iteration_time_s == p.iteration_time_s
        assert ev.energy_j == pytest.approx(p.energy_j, rel=1e-12)


def minimum_time(profile: InstructionProfile, schedule) -> float:
    """The DAG's critical path with every instruction at its fastest profiled option,
    computed here with networkx, independently of the solver."""
    dag = schedule.dag()
    finish: dict = {}
    for node in nx.topological_sort(dag):
        fastest = float(schedule.options(profile, node).time_s.min())
        finish[node] = max((finish[p] for p in dag.predecessors(node)), default=0.0) + fastest
    return max(finish.values())


def test_fastest_point_is_the_all_max_time(real_profile, frontier_8x8):
    """GPT-3's top clock is its fastest: the frontier starts at the all-max time."""
    schedule, frontier, _ = frontier_8x8
    base = evaluate(real_profile, schedule, max_frequencies(real_profile, schedule), P_BLOCK)
    fastest = frontier.points[0]
    assert fastest.iteration_time_s == base.iteration_time_s
    assert fastest.iteration_time_s == pytest.approx(minimum_time(real_profile, schedule), 1e-12)
    assert frontier.all_max is not None and frontier.all_max.energy_j == base.energy_j
    assert fastest.energy_j <= base.energy_j
    # Slack reclaim alone already saves energy at no slowdown on this profile.
    assert fastest.energy_j < 0.99 * base.energy_j
    assert frontier.choose(max_slowdown=0.0) is fastest


def test_progress_reaches_one_and_never_goes_back(frontier_8x8):
    _, _, seen = frontier_8x8
    assert seen[-1] == 1.0
    assert all(0.0 <= a <= b <= 1.0 for a, b in itertools.pairwise(seen))


def test_choose(frontier_8x8):
    _, frontier, _ = frontier_8x8
    pts = frontier.points
    fastest = pts[0].iteration_time_s
    chosen = frontier.choose(max_slowdown=0.05)
    assert chosen.iteration_time_s <= fastest * 1.05 * (1 + 1e-9)
    assert chosen.energy_j == min(p.energy_j for p in pts if p.iteration_time_s <= fastest * 1.05)
    mid = pts[len(pts) // 2]
    assert frontier.choose(deadline_s=mid.iteration_time_s) is mid
    # A deadline a hair below a point's time (within 1e-9 relative) still takes it.
    assert frontier.choose(deadline_s=mid.iteration_time_s * (1 - 1e-12)) is mid
    assert frontier.choose(deadline_s=1e9) is pts[-1]
    with pytest.raises(SolverError, match="fastest plan takes"):
        frontier.choose(deadline_s=fastest * 0.99)
    with pytest.raises(SolverError, match="exactly one"):
        frontier.choose()
    with pytest.raises(SolverError, match="exactly one"):
        frontier.choose(max_slowdown=0.1, deadline_s=10.0)
    with pytest.raises(SolverError, match="max_slowdown"):
        frontier.choose(max_slowdown=-0.1)
    with pytest.raises(SolverError, match="deadline_s"):
        frontier.choose(deadline_s=math.nan)


def test_write_read_round_trip(tmp_path, real_profile, frontier_8x8):
    schedule, frontier, _ = frontier_8x8
    small = Frontier(frontier.points[::40], schedule=schedule, p2p_power_w=frontier.p2p_power_w)
    small.write(tmp_path)
    df = pd.read_csv(tmp_path / "frontier.csv")
    assert tuple(df.columns) == FRONTIER_COLUMNS
    assert list(df["index"]) == list(range(len(small.points)))
    assert df["plan"][0] == "plans/plan_00000.json"
    plan = load_plan(tmp_path / df["plan"][1])
    assert plan.iteration_time == small.points[1].iteration_time_s
    assert evaluate_plan(real_profile, plan).energy_j == pytest.approx(plan.energy, rel=1e-12)
    back = Frontier.read(tmp_path)
    assert back.points == small.points
    assert back.schedule == schedule
    assert back.p2p_power_w == P_BLOCK
    assert back.choose(max_slowdown=0.02) == small.choose(max_slowdown=0.02)
    # Rows are taken in index order, not file order (as `perseus choose` takes them).
    lines = (tmp_path / "frontier.csv").read_text().splitlines()
    (tmp_path / "frontier.csv").write_text("\n".join([lines[0], *reversed(lines[1:])]) + "\n")
    assert Frontier.read(tmp_path).points == small.points
    # Writing again replaces the old plans rather than leaving stale files behind.
    Frontier(small.points[:2], schedule=schedule, p2p_power_w=P_BLOCK).write(tmp_path)
    assert len(list((tmp_path / "plans").glob("*.json"))) == 2
    assert len(Frontier.read(tmp_path).points) == 2


@pytest.mark.parametrize("queue_chars", [2**25, 2**15])  # all queued at once / a few at a time
def test_a_plan_that_cannot_be_written_fails_the_write(
    tmp_path, frontier_8x8, queue_chars, monkeypatch
):
    """Plan files are created by a writer thread while the next rows are built: a file it
    cannot write still fails the write, and no table points at plans that are missing."""
    schedule, frontier, _ = frontier_8x8
    monkeypatch.setattr(frontier_dir, "_WRITE_AHEAD_CHARS", queue_chars)
    some = Frontier(frontier.points[::4], schedule=schedule, p2p_power_w=P_BLOCK)
    rows = [
        FrontierRow(p.iteration_time_s, p.energy_j, p.lower_bound_j, some._plan(p))
        for p in some.points
    ]
    assert len(rows) * len(plan_text(rows[0].plan)) > 4 * 2**15  # the small queue drains

    def rows_while_something_takes_plan_2():
        for k, row in enumerate(rows):
            if k == 1:  # after the old plans are cleared: another process's directory
                (tmp_path / "plans" / "plan_00002.json").mkdir()
            yield row

    with pytest.raises(IsADirectoryError):
        write_frontier_dir(tmp_path, rows_while_something_takes_plan_2())
    written = sorted(p.name for p in (tmp_path / "plans").iterdir())
    assert written == [f"plan_{k:05d}.json" for k in range(len(written))]  # no temporary file
    assert (tmp_path / "plans" / "plan_00002.json").is_dir()
    assert not (tmp_path / "frontier.csv").exists()


def test_read_errors(tmp_path, frontier_8x8):
    schedule, frontier, _ = frontier_8x8
    with pytest.raises(PlanError, match="Cannot read frontier"):
        Frontier.read(tmp_path / "missing")
    (tmp_path / "frontier.csv").write_text("a,b\n1,2\n")
    with pytest.raises(PlanError, match="expected index,iteration_time"):
        Frontier.read(tmp_path)
    (tmp_path / "frontier.csv").write_bytes(b"\xff\xfe\x00index")
    with pytest.raises(PlanError, match="is not a frontier CSV"):
        Frontier.read(tmp_path)
    Frontier(frontier.points[:3], schedule=schedule, p2p_power_w=P_BLOCK).write(tmp_path)
    good = (tmp_path / "frontier.csv").read_text()
    # One reader serves `choose`, `plot` and `Frontier.read`: the same checks everywhere.
    for bad, message in (
        (good.replace(",plans/plan_00001.json", ",", 1), "line 3: no plan path"),
        (good.replace("\n2,", "\n2,inf,", 1), r"line 4 has 6 field\(s\), the header 5"),
        (good.replace("\n1,", "\n1.5,", 1), "line 3: index must be an integer"),
    ):
        (tmp_path / "frontier.csv").write_text(bad)
        with pytest.raises(PlanError, match=message):
            Frontier.read(tmp_path)
    time_1 = good.splitlines()[2].split(",")[1]
    (tmp_path / "frontier.csv").write_text(good.replace(time_1, "nan", 1))
    with pytest.raises(PlanError, match="line 3: iteration_time must be a finite number"):
        Frontier.read(tmp_path)
    (tmp_path / "frontier.csv").write_text(good)
    assert len(Frontier.read(tmp_path).points) == 3
    plan_file = tmp_path / "plans" / "plan_00001.json"
    data = json.loads(plan_file.read_text())
    data["frequencies"] = "eval('boom')"
    plan_file.write_text(json.dumps(data))
    with pytest.raises(PlanError, match="invalid"):
        Frontier.read(tmp_path)


def test_max_points_thins_but_keeps_both_ends(real_profile, frontier_8x8):
    schedule, full, _ = frontier_8x8
    thin = solve_frontier(real_profile, schedule, p2p_power_w=P_BLOCK, max_points=20)
    assert 2 <= len(thin.points) <= 22
    assert thin.points[0] == full.points[0]
    assert thin.points[-1] == full.points[-1]
    with pytest.raises(SolverError, match="max_points"):
        solve_frontier(real_profile, schedule, p2p_power_w=P_BLOCK, max_points=1)


def test_bad_input_is_a_clear_solver_error(real_profile):
    with pytest.raises(SolverError, match="profile has 8 stage"):
        solve_frontier(real_profile, make_schedule("1f1b", 4, 8), p2p_power_w=P_BLOCK)
    with pytest.raises(SolverError, match="blocking"):
        solve_frontier(real_profile, make_schedule("1f1b", 8, 2), p2p_power_w=-1.0)
    with pytest.raises(SolverError, match="resolution_s"):
        solve_frontier(
            real_profile, make_schedule("1f1b", 8, 2), p2p_power_w=P_BLOCK, resolution_s=0.0
        )
    assert issubclass(SolverError, PerseusError)
    with pytest.raises(SolverError, match="at least one point"):
        Frontier([], schedule=make_schedule("1f1b", 8, 2), p2p_power_w=P_BLOCK)


def test_other_schedules_and_noisy_profiles(real_profile):
    """GPipe and interleaved DAGs, and a profile whose fastest option is not max frequency."""
    for schedule in (make_schedule("gpipe", 8, 4), make_schedule("interleaved", 8, 8)):
        frontier = solve_frontier(real_profile, schedule, p2p_power_w=P_BLOCK)
        base = evaluate(real_profile, schedule, max_frequencies(real_profile, schedule), P_BLOCK)
        assert frontier.points[0].iteration_time_s == base.iteration_time_s
        assert frontier.points[0].energy_j <= base.energy_j
    frame = real_profile.to_frame()
    fast = (
        (frame["stage"] == 0) & (frame["instruction"] == "forward") & (frame["frequency"] == 1710)
    )
    frame.loc[fast, "time"] = 0.1  # now faster than at 1740 MHz
    noisy = InstructionProfile.from_frame(frame)
    schedule = make_schedule("1f1b", 8, 4)
    frontier = solve_frontier(noisy, schedule, p2p_power_w=P_BLOCK)
    base = evaluate(noisy, schedule, max_frequencies(noisy, schedule), P_BLOCK)
    t_min = minimum_time(noisy, schedule)
    assert frontier.points[0].iteration_time_s == pytest.approx(t_min, rel=1e-12)
    assert t_min < base.iteration_time_s
    assert all(p.iteration_time_s >= frontier.points[0].iteration_time_s for p in frontier.points)
    no_slowdown = frontier.choose(max_slowdown=0.0)
    assert no_slowdown.iteration_time_s <= base.iteration_time_s
    assert no_slowdown.energy_j < base.energy_j


def test_frontier_point_is_compact_and_comparable():
    p = FrontierPoint(1.0, 10.0, 9.0, [[1410, 1395], [1410]])
    assert p.frequencies == [[1410, 1395], [1410]]
    assert p == FrontierPoint(1.0, 10.0, 9.0, [[1410, 1395], [1410]])
    assert p != FrontierPoint(1.0, 10.0, 9.0, [[1410, 1380], [1410]])
    assert p.gap == pytest.approx(1 / 9)
    assert "iteration_time_s=1.000000" in repr(p)


@pytest.fixture(scope="module")
def bloom_8x12():
    """The published Bloom A40 profile, whose forwards run faster at 1575 MHz than at the
    1740 MHz top clock, and its 8 × 12 frontier (module-scoped: one solve)."""
    profile = load_profile(require_data(SHARED_DATA / "sosp24_bloom-176b_a40_8stage.csv"))
    schedule = make_schedule("1f1b", 8, 12)
    frontier = solve_frontier(profile, schedule, p2p_power_w=P_BLOCK, max_points=None)
    return profile, schedule, frontier


def test_bloom_frontier_starts_at_the_minimum_time_below_all_max(bloom_8x12):
    profile, schedule, frontier = bloom_8x12
    base = evaluate(profile, schedule, max_frequencies(profile, schedule), P_BLOCK)
    times = np.array([p.iteration_time_s for p in frontier.points])
    energies = np.array([p.energy_j for p in frontier.points])
    assert np.all(np.diff(times) > 0) and np.all(np.diff(energies) < 0)
    # The first point is the critical path with every instruction at its fastest option.
    assert times[0] == pytest.approx(minimum_time(profile, schedule), rel=1e-12)
    assert times[0] < base.iteration_time_s  # faster than all-max ...
    assert energies[0] < base.energy_j  # ... and cheaper
    assert frontier.slowdown(frontier.points[0]) < 0
    # All-max is the reference, not a frontier point: it is dominated here.
    assert frontier.all_max is not None
    assert frontier.all_max.iteration_time_s == base.iteration_time_s
    assert frontier.all_max.energy_j == base.energy_j
    assert frontier.all_max.frequencies == max_frequencies(profile, schedule)
    for p in frontier.points[:: max(1, len(times) // 5)]:
        ev = evaluate(profile, schedule, p.frequencies, P_BLOCK)
        assert ev.iteration_time_s == p.iteration_time_s
        assert ev.energy_j == pytest.approx(p.energy_j, rel=1e-12)


def test_bloom_no_slowdown_is_the_cheapest_plan_within_the_all_max_time(bloom_8x12):
    profile, schedule, frontier = bloom_8x12
    base = evaluate(profile, schedule, max_frequencies(profile, schedule), P_BLOCK)
    no_slowdown = frontier.choose(max_slowdown=0.0)
    within = [p for p in frontier.points if p.iteration_time_s <= base.iteration_time_s]
    assert no_slowdown is min(within, key=lambda p: p.energy_j)
    assert frontier.slowdown(no_slowdown) <= 0
    # Held to T >= T(all-max), the old solver's no-slowdown plan was 5.3 % above the LP
    # bound here (any plan with T <= T(all-max) counts for the bound); now it is close.
    bound = float(frontier.lp_curve.lower_bound(base.iteration_time_s))
    assert no_slowdown.energy_j < 1.01 * bound
    # Thinning keeps the no-slowdown plan (the one a max_slowdown of 0 deploys).
    thin = solve_frontier(profile, schedule, p2p_power_w=P_BLOCK, max_points=5)
    assert len(thin.points) <= 8
    assert thin.choose(max_slowdown=0.0) == no_slowdown
    assert thin.points[0] == frontier.points[0] and thin.points[-1] == frontier.points[-1]


def test_bloom_frontier_files_keep_the_all_max_reference(tmp_path, bloom_8x12):
    _, schedule, frontier = bloom_8x12
    frontier.write(tmp_path)
    reference = load_plan(tmp_path / "all_max.json")
    assert frontier.all_max is not None
    assert reference.iteration_time == frontier.all_max.iteration_time_s
    back = Frontier.read(tmp_path)
    assert back.all_max is not None and back.all_max.frequencies == frontier.all_max.frequencies
    for slowdown in (0.0, 0.01):
        assert back.choose(max_slowdown=slowdown) == frontier.choose(max_slowdown=slowdown)
    # A frontier without a reference writes none, and removes a stale one.
    Frontier(frontier.points[:2], schedule=schedule, p2p_power_w=P_BLOCK).write(tmp_path)
    assert not (tmp_path / "all_max.json").exists()
    assert Frontier.read(tmp_path).all_max is None


@pytest.mark.parametrize("profile_name", ["t5_a100_4stage_imbalanced", "bloom_a40_8stage"])
def test_every_rounding_meets_its_lp_deadline(profile_name):
    """Each rounding of an LP solution (breakpoints and points inside LP segments) fits in
    that LP solution's time, using profiled options only."""
    from perseus.planning import PipelineProblem
    from perseus.solver import solve_lp_curve
    from perseus.solver.rounding import Rounder

    path = REPO / "perseus" / "profiles" / f"{profile_name}.csv"
    profile = load_profile(path)
    stages = int(profile.to_frame()["stage"].max()) + 1
    pipeline = PipelineProblem(profile, make_schedule("1f1b", stages, 6), P_BLOCK)
    problem = pipeline.solver
    rounder = Rounder(problem)
    targets: list[tuple[np.ndarray, float]] = []
    prev: list[tuple[float, np.ndarray]] = []

    def on_breakpoint(lam: float, cost: float, d: np.ndarray) -> bool:
        if prev:
            lam_prev, d_prev = prev[0]
            targets.append((0.5 * (d + d_prev), 0.5 * (lam + lam_prev)))
        targets.append((d.copy(), lam))
        prev[:] = [(lam, d.copy())]
        return False

    solve_lp_curve(problem, on_breakpoint=on_breakpoint)
    assert len(targets) > 10
    D = np.stack([d for d, _ in targets], axis=1)
    T = np.array([t for _, t in targets])
    assert np.all(problem.makespan(D) <= T * (1 + 1e-9))  # the LP targets themselves fit
    lead = np.linspace(0.0, 0.05, problem.n)
    for name, kwargs in (
        ("follow_steps", {}),
        ("follow_steps", {"capped": True}),
        ("follow_steps", {"capped": True, "vertices_first": True}),
        ("follow_steps", {"capped": True, "vertices_first": True, "lead": lead}),
        ("follow_steps_backward", {}),
        ("round_steps", {}),
    ):
        steps = getattr(rounder, name)(D, T, **kwargs)
        choice = rounder.options(steps)
        assert np.all(choice < problem.opt_count[problem.type_of][:, None]), name
        plan_T, _, _ = problem.score(choice)
        assert np.all(plan_T <= T * (1 + 1e-9)), name


def _real_breakpoints(real_profile):
    """8×16 on the real profile: problem, rounder, LP curve, and every LP breakpoint's
    durations ``(n, K)`` and times ``(K,)``."""
    from perseus.planning import PipelineProblem
    from perseus.solver import solve_lp_curve
    from perseus.solver.rounding import Rounder

    problem = PipelineProblem(real_profile, make_schedule("1f1b", 8, 16), P_BLOCK).solver
    durations, deadlines = [], []

    def on_breakpoint(lam: float, cost: float, d: np.ndarray) -> bool:
        durations.append(d.copy())
        deadlines.append(lam)
        return False

    curve = solve_lp_curve(problem, on_breakpoint=on_breakpoint)
    return problem, Rounder(problem), curve, np.stack(durations, axis=1), np.array(deadlines)


def test_dithering_beats_plain_rounding_on_the_real_profile(real_profile):
    """The LP runs lock-step backwards between hull vertices 20 ms apart; capped following
    alternates them (dithering) and lands closer to the LP bound than plain following."""
    problem, rounder, curve, D, T = _real_breakpoints(real_profile)
    gaps = {}
    for capped in (False, True):
        plan_T, energy, _ = problem.score(
            rounder.options(rounder.follow_steps(D, T, capped=capped))
        )
        assert np.all(plan_T <= T * (1 + 1e-9))
        gaps[capped] = energy / curve.lower_bound(plan_T) - 1
    assert gaps[True].mean() < gaps[False].mean()
    assert (gaps[True] < gaps[False]).mean() > 0.6


def test_lead_staggers_dithering_on_the_real_profile(real_profile):
    """A zero lead changes nothing; a lead growing downstream makes later stages run
    faster (they keep a margin on the LP) and earlier ones take the slow steps."""
    problem, rounder, _, D, T = _real_breakpoints(real_profile)
    plain = rounder.follow_steps(D, T, capped=True)
    assert np.array_equal(rounder.follow_steps(D, T, capped=True, lead=np.zeros(problem.n)), plain)
    stage = np.empty(problem.n)
    for s, idx in enumerate(problem.resources):
        stage[idx] = s
    led = rounder.follow_steps(D, T, capped=True, lead=0.02 * stage / stage.max())
    plan_T, _, _ = problem.score(rounder.options(led))
    assert np.all(plan_T <= T * (1 + 1e-9))
    moved = rounder.times(led) - rounder.times(plain)  # per instruction and target
    first, before_last = problem.resources[0], problem.resources[-2]
    assert moved[first].sum() > 0 > moved[before_last].sum()


@pytest.mark.parametrize("microbatches", [16, 4])
def test_staggered_lead_grows_downstream_and_ramps_in_over_the_warm_up(real_profile, microbatches):
    """0 on the first stage, largest on the last; microbatch j gets (j + 1) / min(S, M)
    of it, so with fewer microbatches than stages the last one still gets all of it."""
    from perseus.planning import PipelineProblem
    from perseus.solver.frontier import _LEAD_FRACTION, staggered_lead

    pipeline = PipelineProblem(real_profile, make_schedule("1f1b", 8, microbatches), P_BLOCK)

    problem = pipeline.solver
    S, R = 8, min(8, microbatches)
    lead = staggered_lead(problem, 0.2)
    full = _LEAD_FRACTION * 0.2  # on the last stage, once ramped in
    for s, idx in enumerate(problem.resources):
        for i in idx:
            j = pipeline.instructions[i].microbatch
            expected = full * s / (S - 1) * min(1.0, (j + 1) / R)
            assert lead[i] == pytest.approx(expected, abs=1e-15)
    assert lead.max() == pytest.approx(full)


def test_ramped_lead_beats_a_flat_lead_near_the_all_max_time(real_profile):
    """In the warm-up the late stages' first backwards sit on the steepest part of their
    hulls; a flat lead runs them at the top clock, the ramped one lets them take their LP
    time. Near the all-max time the ramped lead's plans are closer to the LP bound."""
    from perseus.solver.frontier import _LEAD_FRACTION, staggered_lead

    problem, rounder, curve, D, T = _real_breakpoints(real_profile)
    fast = problem.choices_to_arrays(problem.reference_choice())[0]
    t_fast = problem.makespan(fast)
    near = t_fast * 1.02 >= T
    assert near.sum() >= 20
    ramped = staggered_lead(problem, float(fast.mean()))
    stage = np.empty(problem.n)
    for s, idx in enumerate(problem.resources):
        stage[idx] = s / (len(problem.resources) - 1)
    flat = _LEAD_FRACTION * float(fast.mean()) * stage  # the same lead, not ramped
    gaps = {}
    for name, lead in (("flat", flat), ("ramped", ramped)):
        steps = rounder.follow_steps(
            D[:, near], T[near], capped=True, vertices_first=True, lead=lead
        )
        plan_T, energy, _ = problem.score(rounder.options(steps))
        assert np.all(plan_T <= T[near] * (1 + 1e-9))
        gaps[name] = energy / curve.lower_bound(plan_T) - 1
    assert gaps["ramped"].mean() < gaps["flat"].mean()
    assert (gaps["ramped"] < gaps["flat"]).mean() > 0.6


def test_vertex_first_reclaim_beats_staircase_reclaim_on_the_real_profile(real_profile):
    """After dithering, leftover slack too small to reach a hull vertex is better left to
    an earlier instruction that can reach one than spent on an in-between option far
    above the hull (the real backward hull jumps 284.8 → 305.3 ms)."""
    problem, rounder, curve, D, T = _real_breakpoints(real_profile)
    gaps = {}
    for vertices_first in (False, True):
        steps = rounder.follow_steps(D, T, capped=True, vertices_first=vertices_first)
        plan_T, energy, _ = problem.score(rounder.options(steps))
        assert np.all(plan_T <= T * (1 + 1e-9))
        gaps[vertices_first] = energy / curve.lower_bound(plan_T) - 1
    assert gaps[True].mean() < gaps[False].mean()
    assert (gaps[True] < gaps[False]).sum() > (gaps[True] > gaps[False]).sum()


@pytest.mark.parametrize("width", [1, 2, 7, 8, 9, 28, 32])
def test_level_rows_count_and_take_match_the_plain_numpy_forms(width):
    # The rounding's binary search over padded rows must count exactly what the boolean
    # comparison counts, ties and +inf padding included.
    from perseus.solver.levels import LevelRows

    rng = np.random.default_rng(width)
    rows = np.sort(rng.choice(np.arange(1.0, 200.0), size=(5, width)), axis=1)
    rows[0, width // 2 :] = np.inf  # a type with fewer steps, padded like the step tables
    budgets = np.concatenate(
        [rng.uniform(0.0, 210.0, size=(5, 40)), rows[:, rng.integers(0, width, 8)]], axis=1
    )  # random values plus exact ties with entries (+inf ones too)
    table = LevelRows(rows, np.nan)
    expected = (rows[:, :, None] <= budgets[:, None, :]).sum(axis=1)
    assert np.array_equal(table.count_at_most(budgets), expected)
    positions = rng.integers(0, width, size=(5, 12))
    assert np.array_equal(table.take(positions), np.take_along_axis(rows, positions, axis=1))
