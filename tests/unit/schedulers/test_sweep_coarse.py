"""The coarse-to-fine sweep: coarse levels, the refinement rule, and the state machine."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from perseus.domain.schedule import make_schedule
from perseus.errors import ConfigurationError
from perseus.protocol import JobInfo, PipelineSpec, ProfilingResult, RankInfo
from perseus.schedulers.profiler import InstructionProfiler, ProfilerArgs
from perseus.schedulers.sweep.instruction_sweep import InstructionSweep, SweepPhase
from perseus.schedulers.sweep.levels import coarse_levels, refine_levels
from perseus.schedulers.zeus import ZeusArgs
from perseus.settings import PerseusSettings

LEVELS = list(range(1500, 690, -30))  # 28 levels, 1500 … 690 MHz


def test_coarse_levels_take_every_step_th():
    assert coarse_levels([10, 9, 8, 7, 6, 5], 2) == [10, 8, 6]
    assert coarse_levels([10, 9, 8], 1) == [10, 9, 8]
    assert coarse_levels([10, 9, 8], 5) == [10]


def test_below_the_lowest_point_only_when_it_is_the_cheapest():
    falling = {1500: (0.10, 40.0), 1380: (0.11, 38.0), 1260: (0.12, 37.0)}
    assert refine_levels(falling, LEVELS[:10], 1.0) == [1440, 1320, 1230]
    rising = {1500: (0.10, 40.0), 1380: (0.11, 38.0), 1260: (0.12, 39.0)}
    assert 1230 not in refine_levels(rising, LEVELS[:10], 1.0)


def _down_to(lowest: int) -> list[int]:
    """The levels down to `lowest` (the tests' measured points span them all)."""
    return [f for f in LEVELS if f >= lowest]


def _convex(f: int) -> tuple[float, float]:
    """Time ∝ 1/f; energy U-shaped with its minimum at 1080 MHz (not a coarse level)."""
    t = 0.1 * 1500 / f
    return t, 30.0 + 1e-4 * (f - 1080) ** 2


def _line(f: int) -> tuple[float, float]:
    """Energy falls linearly with time: every point on one straight hull."""
    t = 0.1 * 1500 / f
    return t, 50.0 - 100.0 * t


def test_a_straight_hull_refines_only_next_to_the_fastest_and_the_cheapest():
    measured = {f: _line(f) for f in (1500, 1380, 1260, 1140, 1020)}
    # Bisection: the middle skipped level between each anchor and its measured neighbour.
    assert refine_levels(measured, _down_to(1020), 0.0005) == [1440, 1080]


def test_a_bend_refines_its_neighbours_and_a_gentle_one_does_not():
    def corner(f: int) -> tuple[float, float]:
        t = 0.1 * 1500 / f
        return t, 60.0 - 200.0 * min(t, 0.15) - 20.0 * max(0.0, t - 0.15)

    measured = {f: corner(f) for f in (1500, 1380, 1260, 1140, 1020, 900)}
    # The hull bends at 1020 MHz (t = 0.147 s); the anchors are 1500 and 900.
    got = refine_levels(measured, _down_to(900), 0.0005)
    assert 1080 in got and 960 in got  # either side of the bend
    assert 1320 not in got and 1200 not in got  # the straight stretch between
    assert refine_levels(measured, _down_to(900), 0.5) == [1440, 960]  # anchors only


def test_dominated_points_are_no_anchor_and_done_means_nothing_left():
    measured = {1500: (0.10, 40.0), 1470: (0.11, 41.0), 1440: (0.105, 39.0)}
    # 1470 is slower and dearer than 1500: not on the hull. The anchors 1500 and 1440 have
    # nothing skipped between them and their neighbours.
    assert refine_levels(measured, _down_to(1440), 0.0) == []
    assert refine_levels({1500: (0.1, 40.0)}, LEVELS, 0.0) == []


def test_refining_to_the_end_finds_the_true_minimum_with_fewer_measurements():
    measured = {f: _convex(f) for f in coarse_levels(LEVELS, 4)}
    rounds = 0
    while batch := refine_levels(measured, LEVELS, 0.0005):
        assert all(f not in measured for f in batch)
        measured.update({f: _convex(f) for f in batch})
        rounds += len(batch)
    assert min(measured, key=lambda f: measured[f][1]) == 1080  # the true minimum
    assert len(measured) < len(LEVELS)
    assert rounds < len(LEVELS) - len(coarse_levels(LEVELS, 4))


# ---------------------------------------------------------------------- the state machine
def _plateau(f: int, kind: str) -> tuple[float, float]:
    """A power-capped top (energy up to 2.5 % apart, no trend above 1200 MHz), then a convex
    valley with its minimum at 990 MHz (the backward's, twice as long, at 1110 MHz)."""
    scale = 2.0 if kind == "backward" else 1.0
    t = 0.1 * 1500 / f
    if f > 1200:
        wiggle = (0.0, 0.01, 0.025)[(1500 - f) // 30 % 3]
        e = 40.0 * (1.0 + wiggle)
    else:
        e = 30.0 + 2e-4 * (f - (990 if kind == "forward" else 1110)) ** 2
    return scale * t, scale * e


def _profiler(tmp_path, **args) -> InstructionProfiler:
    schedule = make_schedule("1f1b", 1, 1)
    info = JobInfo(
        pp_degree=1, dp_degree=1, tp_degree=1, world_size=1, pipeline=PipelineSpec.of(schedule)
    ).model_copy(update={"job_id": "unit"})
    ranks = [RankInfo(rank=0, dp_rank=0, pp_rank=0, tp_rank=0, available_frequencies=LEVELS)]
    settings = PerseusSettings(scheduler="InstructionProfiler", dump_dir=str(tmp_path))
    return InstructionProfiler(info, ranks, settings, ProfilerArgs(warmup_rounds=0, **args))


def _run(profiler: InstructionProfiler) -> list[dict[str, int]]:
    """Round by round until the sweep is done: the clock of each kind per round."""
    rounds = []
    while not profiler.sweep.done:
        (schedule,) = profiler.next_schedule()
        freqs = dict(schedule.frequencies)
        rounds.append(freqs)
        te = {k: _plateau(f, k) for k, f in freqs.items()}
        iter_time = math.fsum(t for t, _ in te.values())
        profiler.observe(
            [
                ProfilingResult(
                    rank=0,
                    iter_time=[iter_time],
                    iter_energy=[math.fsum(e for _, e in te.values())],
                    time_breakdown={k: [[t]] for k, (t, _) in te.items()},
                    energy_breakdown={k: [[e]] for k, (_, e) in te.items()},
                )
            ]
        )
        assert len(rounds) <= len(LEVELS), "never more rounds than levels"
    return rounds


def test_full_sweep_stops_on_the_noisy_plateau_coarse_finds_the_valley(tmp_path):
    full = _profiler(tmp_path / "full", sweep="full")
    _run(full)
    assert min(full.sweep.energy_j[0, "forward"]) > 1200  # fooled by two rises in a row

    coarse = _profiler(tmp_path / "coarse")
    rounds = _run(coarse)
    measured = coarse.sweep.energy_j[0, "forward"]
    assert min(measured, key=measured.__getitem__) == 990  # the true minimum, refined
    backward = coarse.sweep.energy_j[0, "backward"]
    assert min(backward, key=backward.__getitem__) == 1110
    assert min(measured) > LEVELS[-1]  # stopped past the valley, before the lowest level
    assert len(rounds) < len(LEVELS)
    # The coarse pass ran every 4th level together; REFINE runs each kind at its own level.
    assert [r["forward"] for r in rounds[:3]] == [1500, 1380, 1260]
    assert any(r["forward"] != r["backward"] for r in rounds)
    assert (tmp_path / "coarse" / "unit" / "instruction_profile.csv").is_file()


def test_without_refine_only_the_coarse_levels_are_measured(tmp_path):
    profiler = _profiler(tmp_path, refine=False)
    _run(profiler)
    assert set(profiler.sweep.energy_j[0, "forward"]) <= set(coarse_levels(LEVELS, 4))
    assert profiler.sweep.phase is SweepPhase.DONE


def test_grouped_sweeps_need_the_full_sweep(tmp_path):
    profiler = _profiler(tmp_path)
    with pytest.raises(ConfigurationError, match="sweep='full'"):
        InstructionSweep(profiler, ProfilerArgs(), group=lambda s, n: "all")
    with pytest.raises(ValidationError, match="full"):
        ZeusArgs(sweep="coarse")  # type: ignore[arg-type]
