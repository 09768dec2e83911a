"""3D parallelism as a wrapper: stage plans fan out to ranks, rank results fold into stages."""

from __future__ import annotations

import pytest

from perseus.client.wire.fold import GroupFold
from perseus.domain.schedule import make_schedule
from perseus.errors import ConfigurationError, PlanError, RankError
from perseus.protocol import JobInfo, ProfilingResult, RankInfo
from perseus.schedulers.parallel import Parallel3D

ONE_F_ONE_B = make_schedule("1f1b", 2, 1)  # one forward and one backward per rank

# dp=2, pp=2, tp=2: rank = dp·4 + pp·2 + tp
LAYOUT = [(r // 4, (r // 2) % 2, r % 2) for r in range(8)]


def _job() -> JobInfo:
    return JobInfo(pp_degree=2, dp_degree=2, tp_degree=2, world_size=8)


def _ranks(freqs: dict[int, list[int]] | None = None) -> list[RankInfo]:
    return [
        RankInfo(
            rank=r,
            dp_rank=d,
            pp_rank=p,
            tp_rank=t,
            available_frequencies=(freqs or {}).get(r, [1410, 1200, 900]),
        )
        for r, (d, p, t) in enumerate(LAYOUT)
    ]


def _result(rank: int, fwd_s: float, fwd_j: float) -> ProfilingResult:
    return ProfilingResult(
        rank=rank,
        iter_time=[1.0],
        iter_energy=[100.0 + rank],
        time_breakdown={"forward": [[fwd_s]], "backward": [[2 * fwd_s]]},
        energy_breakdown={"forward": [[fwd_j]], "backward": [[2 * fwd_j]]},
    )


def test_stage_plans_fan_out_to_every_rank_of_the_stage() -> None:
    par = Parallel3D(_job(), _ranks(), ONE_F_ONE_B)
    plan = [[("forward", 1410), ("backward", 1200)], [("forward", 900), ("backward", 900)]]
    slow = [[("forward", 900), ("backward", 900)]] * 2
    schedules = par.schedules_for(plan, {1: slow})
    assert [s.rank for s in schedules] == list(range(8))
    for s, (d, p, _) in zip(schedules, LAYOUT, strict=True):
        assert s.frequencies == (slow if d == 1 else plan)[p]


def test_results_fold_into_stages_max_time_and_first_pipeline_tp_energy() -> None:
    par = Parallel3D(_job(), _ranks(), ONE_F_ONE_B)
    results = [_result(r, fwd_s=0.1 + 0.01 * r, fwd_j=10.0 + r) for r in range(8)]
    m = par.measure(results)
    assert m is not None
    for stage in (0, 1):
        members = [r for r, (_, p, _) in enumerate(LAYOUT) if p == stage]
        first_dp = [r for r in members if LAYOUT[r][0] == 0]
        assert m.stages[stage].time_s["forward"] == pytest.approx(0.1 + 0.01 * max(members))
        assert m.stages[stage].energy_j["forward"] == pytest.approx(sum(10.0 + r for r in first_dp))
    assert par.measure(results[:-1]) is None  # a rank did not report


def test_missing_ranks_and_disjoint_clocks_are_refused() -> None:
    with pytest.raises(RankError, match="7 rank"):
        Parallel3D(_job(), _ranks()[:7], ONE_F_ONE_B)
    with pytest.raises(ConfigurationError, match="share no available frequency"):
        Parallel3D(_job(), _ranks({0: [1500]}), ONE_F_ONE_B)
    with pytest.raises(PlanError, match="3 stage"):
        Parallel3D(_job(), _ranks(), make_schedule("1f1b", 3, 1))


def _pipeline_job(pp: int) -> tuple[JobInfo, list[RankInfo]]:
    infos = [
        RankInfo(rank=r, dp_rank=0, pp_rank=r, tp_rank=0, available_frequencies=[1410])
        for r in range(pp)
    ]
    return JobInfo(pp_degree=pp, dp_degree=1, tp_degree=1, world_size=pp), infos


def _executed(schedule, rank: int, duration) -> ProfilingResult:
    """Rank `rank`'s result for two iterations of its order, each instruction taking
    duration(instruction, iteration) seconds (and as many joules × 10)."""
    tb: dict[str, list[list[float]]] = {}
    eb: dict[str, list[list[float]]] = {}
    for it in range(2):
        for kind in ("forward", "backward", "backward_input", "backward_weight"):
            tb.setdefault(kind, []).append([])
            eb.setdefault(kind, []).append([])
        for instr in schedule.orders[rank]:
            tb[instr.kind][-1].append(duration(instr, it))
            eb[instr.kind][-1].append(10 * duration(instr, it))
    return ProfilingResult(
        rank=rank,
        iter_time=[5.0, 5.0],
        iter_energy=[500.0, 500.0],
        time_breakdown=tb,
        energy_breakdown=eb,
    )


@pytest.mark.parametrize(
    ("name", "chunks"), [("interleaved", 2), ("interleaved", 3), ("zb", 1), ("gpipe", 1)]
)
def test_occurrences_fold_into_their_virtual_stage_and_kind(name: str, chunks: int) -> None:
    schedule = make_schedule(name, 2, 4, num_chunks=chunks)
    job, infos = _pipeline_job(2)
    par = Parallel3D(job, infos, schedule)

    base = {"forward": 1, "backward": 2, "backward_input": 3, "backward_weight": 4}

    def value(stage: int, kind: str) -> float:  # a distinct value per (stage, kind)
        return 0.1 * stage + 0.01 * base[kind]

    def duration(instr, it):  # ... that varies with the microbatch and the iteration
        return value(instr.stage, instr.kind) + 0.001 * instr.microbatch * it

    m = par.measure([_executed(schedule, r, duration) for r in range(2)])
    assert m is not None
    assert len(m.virtual_stages) == schedule.num_virtual_stages
    mean_jitter = 0.001 * 1.5 * 0.5  # mean microbatch 1.5, mean iteration factor 0.5
    for stage, vs in enumerate(m.virtual_stages):
        assert vs.rank == schedule.stage_ranks[stage]
        kinds = {i.kind for o in schedule.orders for i in o if i.stage == stage}
        assert set(vs.time_s) == kinds == set(vs.energy_j)
        for kind in kinds:
            expected = value(stage, kind)
            assert vs.time_s[kind] == pytest.approx(expected + mean_jitter)
            assert vs.energy_j[kind] == pytest.approx(10 * (expected + mean_jitter))
    # Per pipeline rank: the mean over all the rank's stages, as before.
    for rank, st in enumerate(m.stages):
        fwd = [s for s, r in enumerate(schedule.stage_ranks) if r == rank]
        assert st.time_s["forward"] == pytest.approx(
            sum(0.1 * s + 0.01 for s in fwd) / len(fwd) + mean_jitter
        )


def test_occurrence_counts_must_match_the_rank_order_naming_rank_and_kind() -> None:
    schedule = make_schedule("zb", 2, 3)
    job, infos = _pipeline_job(2)
    par = Parallel3D(job, infos, schedule)
    good = [_executed(schedule, r, lambda i, it: 0.01) for r in range(2)]
    assert par.measure(good) is not None
    short = good[1].model_copy(deep=True)
    short.time_breakdown["backward_weight"][1].pop()
    with pytest.raises(
        RankError,
        match=r"Rank 1 reported 2 'backward_weight' duration\(s\).*"
        r"iteration 1.*runs 3 backward_weight",
    ):
        par.measure([good[0], short])
    extra = good[0].model_copy(deep=True)
    extra.time_breakdown["backward"][0].append(0.01)
    with pytest.raises(RankError, match=r"Rank 0 reported 1 'backward'.*runs no backward"):
        par.measure([extra, good[1]])
    fewer_iterations = good[0].model_copy(deep=True)
    del fewer_iterations.energy_breakdown["forward"][1]
    with pytest.raises(RankError, match=r"Rank 0 .*'forward'.*one list per iteration"):
        par.measure([fewer_iterations, good[1]])


def _leader_job() -> tuple[JobInfo, list[RankInfo], dict[int, GroupFold]]:
    """dp=2, pp=2, tp=2 with one leader per stage (ranks 0 and 2 of LAYOUT)."""
    job = _job().model_copy(update={"protocol_version": 2, "leaders_per_stage": 1})
    leaders = [i.model_copy(update={"replicas": [0, 1]}) for i in _ranks() if i.rank in (0, 2)]
    folds = {
        i.rank: GroupFold(
            leader=i.rank,
            members=[r for r, (_, p, _) in enumerate(LAYOUT) if p == i.pp_rank],
            replicas=range(2),
        )
        for i in leaders
    }
    return job, leaders, folds


def test_with_leaders_a_stage_plan_goes_to_its_leader_with_each_replicas_own_list() -> None:
    job, leaders, _ = _leader_job()
    par = Parallel3D(job, leaders, ONE_F_ONE_B)
    plan = [[("forward", 1410), ("backward", 1200)], [("forward", 900), ("backward", 900)]]
    slow = [[("forward", 900), ("backward", 900)]] * 2
    schedules = par.schedules_for(plan, {1: slow})
    assert [s.rank for s in schedules] == [0, 2]
    assert schedules[0].frequencies == plan[0]
    assert schedules[0].replica_frequencies == {1: slow[0]}
    assert schedules[1].replica_frequencies == {}  # replica 1 runs stage 1's list anyway
    with pytest.raises(RankError, match="8 rank\\(s\\) registered but the job has 2 leader"):
        Parallel3D(job, _ranks(), ONE_F_ONE_B)


def test_with_leaders_the_folded_results_measure_as_every_ranks_would() -> None:
    """The same round, reported by every rank or folded in-job by the leaders: the same stage
    times (max), first-pipeline tp energies, busy time per (dp, pp) and job energy."""
    results = [_result(r, fwd_s=0.1 + 0.01 * r, fwd_j=10.0 + r) for r in range(8)]
    every = Parallel3D(_job(), _ranks(), ONE_F_ONE_B).measure(results)
    job, leaders, folds = _leader_job()
    dp = {r: d for r, (d, _, _) in enumerate(LAYOUT)}
    by_rank = {r.rank: r for r in results}
    folded = [folds[i.rank].fold(by_rank, dp) for i in leaders]
    led = Parallel3D(job, leaders, ONE_F_ONE_B).measure(folded)
    assert every is not None and led is not None
    for a, b in zip(every.stages, led.stages, strict=True):
        assert a.time_s == pytest.approx(b.time_s)
        assert a.energy_j == pytest.approx(b.energy_j)
        assert a.busy_s == pytest.approx(b.busy_s)
        assert a.iteration_energy_j == pytest.approx(b.iteration_energy_j)
    assert led.busy_s == pytest.approx(every.busy_s)
    assert led.job_energy_j == pytest.approx(every.job_energy_j)
    assert led.iteration_time_s == pytest.approx(every.iteration_time_s)


# F F B B per iteration: forwards at 1410, backwards at 810 (a clock change lands in 15 ms).
FFBB = [(0, "forward", 1410), (0, "forward", 1410), (0, "backward", 810), (0, "backward", 810)]
FFBB_WHERE = {"forward": [0, 1], "backward": [2, 3]}


def test_instructions_run_while_a_clock_change_lands_are_left_out_of_unit_times():
    from perseus.schedulers.measurement import clean_unit_times

    units, where = FFBB, FFBB_WHERE
    tb = {"forward": [[0.02, 0.008]] * 2, "backward": [[0.03, 0.02]] * 2}
    times = clean_unit_times(units, where, tb, 0.015)
    # Each forward pair and backward pair starts a change: its first instruction is out,
    # its second (20 ms and 30 ms after the change began) counts.
    assert times == {(0, "forward", 1410): (0.016, 2), (0, "backward", 810): (0.04, 2)}
    # No switching latency: everything counts.
    assert clean_unit_times(units, where, tb, 0.0)[(0, "forward", 1410)] == (0.056, 4)
    # A unit with no instruction clear of a change keeps all of them.
    short = {"forward": [[0.001, 0.001]], "backward": [[0.03, 0.02]]}
    assert clean_unit_times(units, where, short, 0.015)[(0, "forward", 1410)] == (0.002, 2)


def test_a_unit_none_of_whose_instructions_ran_clear_of_a_change_is_landing_only():
    from perseus.schedulers.measurement import landing_only_units

    units, where = FFBB, FFBB_WHERE
    # Each pair's second instruction starts 20 / 30 ms after the change: both units clear.
    tb = {"forward": [[0.02, 0.008]] * 2, "backward": [[0.03, 0.02]] * 2}
    assert landing_only_units(units, where, tb, 0.015) == frozenset()
    # 1 ms forwards: both start within the 15 ms of the change the first one asked for.
    short = {"forward": [[0.001, 0.001]] * 2, "backward": [[0.03, 0.02]] * 2}
    assert landing_only_units(units, where, short, 0.015) == {(0, "forward", 1410)}
    assert landing_only_units(units, where, short, 0.0) == frozenset()
    # Idle before the second forward (a wait for a peer) lets the change land first.
    assert landing_only_units(units, where, short, 0.015, [0.0, 0.020, 0.0, 0.0]) == set()


def test_a_change_that_lands_in_microseconds_leaves_millisecond_instructions_clear():
    from perseus.schedulers.measurement import (
        MAX_LANDING_SHARE,
        clean_unit_times,
        landing_only_units,
    )

    # Every instruction starts a change (F and B alternate clocks), as in a sweep's refine
    # round on a zero-bubble or last pipeline rank.
    units = [(0, "forward", 1410), (0, "backward", 810)] * 2
    where = {"forward": [0, 2], "backward": [1, 3]}
    tb = {"forward": [[0.010, 0.010]], "backward": [[0.020, 0.020]]}
    lag_s = 6.6e-6  # what a rank measures on the emulator without a switching latency
    assert landing_only_units(units, where, tb, lag_s) == frozenset()
    assert clean_unit_times(units, where, tb, lag_s)[(0, "backward", 810)] == (0.04, 2)
    # A landing just over the share of each instruction leaves both units landing-only.
    lag_s = 0.010 * MAX_LANDING_SHARE * 1.01
    assert landing_only_units(units, where, tb, lag_s) == {(0, "forward", 1410)}
    assert landing_only_units(units, where, tb, 0.020 * MAX_LANDING_SHARE * 1.01) == set(units)


def test_a_landing_only_time_is_not_the_clocks_own():
    from perseus.schedulers.measurement import RoundMeasurement, measured_unit_time

    unit = (0, "forward", 810)

    def round_of(unit_time, landing_only):
        return RoundMeasurement(
            stages=[],
            virtual_stages=[],
            iteration_time_s=1.0,
            pipeline_energy_j=1.0,
            job_energy_j=1.0,
            busy_s={},
            p2p_power_w=None,
            unit_time=unit_time,
            landing_only=landing_only,
        )

    # Two tensor-parallel ranks: one ran the unit clear of a change, its time is the one.
    m = round_of({0: {unit: (0.030, 2)}, 1: {unit: (0.018, 2)}}, {1: frozenset({unit})})
    assert measured_unit_time(m, 0, "forward", 810, 9.0) == (pytest.approx(0.015), True)
    m = round_of({0: {unit: (0.018, 2)}}, {0: frozenset({unit})})
    assert measured_unit_time(m, 0, "forward", 810, 9.0) == (pytest.approx(0.009), False)
    # A round without per-unit times (an older client): the stage's time, taken as own.
    assert measured_unit_time(round_of({}, {}), 0, "forward", 810, 9.0) == (9.0, True)


def test_windows_charge_seconds_run_before_a_change_lands_to_the_previous_clock():
    from perseus.schedulers.measurement import window_shares

    # The first of each pair starts a change and runs its first 15 ms at the other kind's
    # clock; the second starts 20 ms (30 ms) after the change began, clear of it.
    units, where = FFBB, FFBB_WHERE
    tb = {"forward": [[0.02, 0.008]] * 3, "backward": [[0.03, 0.02]] * 3}
    shares = window_shares(units, where, tb, 0.015)
    assert shares[1] == [(units[1], 1.0)] and shares[3] == [(units[3], 1.0)]
    assert shares[2] == [((0, "backward", 1410), 0.5), (units[2], 0.5)]
    assert window_shares(units, where, tb, 0.0) == [[(u, 1.0)] for u in units]
    # The round's first forward lands the change the round starts with, made once: its
    # first 15 ms are in no window (the rank's windows begin once it landed) and count for
    # no clock. The next two iterations' first forwards land the backwards' 810 MHz for
    # 15 ms each: 30 of the 45 ms the windows hold.
    assert shares[0] == [
        ((0, "forward", 810), pytest.approx(2 / 3)),
        (units[0], pytest.approx(1 / 3)),
    ]
    # A round whose only change is its first: every window second is the unit's own.
    same = [(0, "forward", 810), (0, "forward", 810), (0, "backward", 810), (0, "backward", 810)]
    assert window_shares(same, where, tb, 0.015) == [[(u, 1.0)] for u in same]
    # 1 ms forwards: both run wholly before the change lands, at the backwards' clock.
    short = {"forward": [[0.001, 0.001]] * 3, "backward": [[0.03, 0.02]] * 3}
    assert window_shares(units, where, short, 0.015)[1] == [((0, "forward", 810), 1.0)]


def test_a_clock_change_lands_in_wall_time_across_idle_gaps():
    """A 2 ms forward starts a change that takes 15 ms to land; the GPU then waits 20 ms
    for a peer before the next forward. In busy seconds that forward would start 2 ms into
    the change (and be charged to the wrong clock); in wall time it starts 22 ms in, clear."""
    from perseus.schedulers.measurement import clean_unit_times, window_shares

    units, where = FFBB, FFBB_WHERE
    tb = {"forward": [[0.002, 0.002]] * 2, "backward": [[0.03, 0.02]] * 2}
    busy = clean_unit_times(units, where, tb, 0.015)
    assert busy[0, "forward", 1410] == (pytest.approx(0.008), 4)  # none clear: all kept
    idle = [0.0, 0.020, 0.0, 0.0]
    wall = clean_unit_times(units, where, tb, 0.015, idle)
    assert wall[0, "forward", 1410] == (pytest.approx(0.004), 2)  # each iteration's second
    assert window_shares(units, where, tb, 0.015, idle_before_s=idle)[1] == [(units[1], 1.0)]
    assert window_shares(units, where, tb, 0.015)[1] == [((0, "forward", 810), 1.0)]
    # Idle before an instruction that starts a change does not count: it begins there.
    assert clean_unit_times(units, where, tb, 0.015, [0.0, 0.0, 0.050, 0.0]) == busy


def test_seconds_landing_a_change_asked_for_before_the_last_one_landed_are_unsure():
    """With 1 ms forwards and a 15 ms switch, the backwards' change is asked for 2 ms after
    the forwards': the GPU may still run the clock before both (a GPU that restarts its
    switch when asked again) or the forwards' (as `window_shares` charges it). The first
    backward's first 15 ms, in each of the three iterations, are unsure: 45 of 156 ms."""
    from perseus.schedulers.measurement import unsure_clock_share

    units, where = FFBB, FFBB_WHERE
    short = {"forward": [[0.001, 0.001]] * 3, "backward": [[0.03, 0.02]] * 3}
    assert unsure_clock_share(units, where, short, 0.015) == pytest.approx(45 / 156)
    # Every change lands before the next is asked for (the forwards last 28 ms together).
    long = {"forward": [[0.02, 0.008]] * 3, "backward": [[0.03, 0.02]] * 3}
    assert unsure_clock_share(units, where, long, 0.015) == 0.0
    # A clock that lands at once, or a round with no change but its first: nothing unsure.
    assert unsure_clock_share(units, where, short, 0.0) == 0.0
    same = [(0, "forward", 810), (0, "forward", 810), (0, "backward", 810), (0, "backward", 810)]
    assert unsure_clock_share(same, where, short, 0.015) == 0.0
    # The GPU waits 20 ms for a peer before the first backward: the forwards' change lands
    # meanwhile, and the backwards' is an ordinary one (`window_shares` charges it).
    assert unsure_clock_share(units, where, short, 0.015, [0.0, 0.0, 0.020, 0.0]) == 0.0


def _one_rank(switch_latency_s: float) -> Parallel3D:
    info = RankInfo(
        rank=0,
        dp_rank=0,
        pp_rank=0,
        tp_rank=0,
        available_frequencies=[1410, 810],
        switch_latency_s=switch_latency_s,
    )
    job = JobInfo(pp_degree=1, dp_degree=1, tp_degree=1, world_size=1)
    return Parallel3D(job, [info], make_schedule("1f1b", 1, 2))


def test_a_round_run_mostly_at_unsure_clocks_gives_the_power_fit_no_windows():
    from perseus.protocol import EnergyWindow

    par = _one_rank(0.015)
    order = par.schedule.orders[0]
    kinds = [i.kind for i in order]
    clocks = [("forward", 1410) if k == "forward" else ("backward", 810) for k in kinds]
    window = EnergyWindow(energy_j=20.0, time_s=0.1, busy_s=[0.02] * len(order))

    def round_with(forward_s: float):
        result = ProfilingResult(
            rank=0,
            iter_time=[0.1] * 3,
            iter_energy=[20.0] * 3,
            time_breakdown={
                "forward": [[forward_s] * kinds.count("forward")] * 3,
                "backward": [[0.03] * kinds.count("backward")] * 3,
            },
            energy_breakdown={
                "forward": [[1.0] * kinds.count("forward")] * 3,
                "backward": [[2.0] * kinds.count("backward")] * 3,
            },
            energy_windows=[window] * 4,
        )
        m = par.measure([result], {0: clocks})
        assert m is not None
        return m.windows[0]

    # Each kind lasts longer than the switch: every change lands before the next.
    assert len(round_with(0.020)) == 4
    # 1 ms forwards between 30 ms backwards at another clock: each backward's change is
    # asked for 1 ms after the forward's, a third of the round runs at a clock the rank
    # cannot know, and no window of the round reaches the fit.
    assert round_with(0.001) == []
    # The same round on a GPU whose clocks land at once keeps its windows.
    par = _one_rank(0.0)
    assert len(round_with(0.001)) == 4
