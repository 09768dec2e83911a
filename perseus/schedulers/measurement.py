"""What a scheduler plans and what it measures, per pipeline rank and per pipeline stage.

A `StagePlan` is the plan of one iteration per pipeline rank; `RoundMeasurement` is one
complete round of results, aggregated by `perseus.schedulers.parallel.Parallel3D` (whose module
docstring gives the rule: times are the max over a stage's copies, energies the sum over
the tensor-parallel ranks of the first data-parallel pipeline).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "RoundMeasurement",
    "StageMeasurement",
    "StagePlan",
    "MAX_LANDING_SHARE",
    "MAX_UNSURE_CLOCK_SHARE",
    "Unit",
    "VirtualStageMeasurement",
    "WindowRow",
    "clean_unit_times",
    "landing_only_units",
    "measured_unit_time",
    "round_unit_times",
    "unit_time",
    "unsure_clock_share",
    "window_shares",
]


Unit = tuple[int, str, int]
"""(pipeline stage, instruction kind, SM clock in MHz)."""

MAX_LANDING_SHARE = 0.001
"""An instruction that started while a clock change was landing still times its own clock
when at most this share of its time was within the landing: its time is then its clock's
within 0.1 % × the clocks' ratio (under 0.6 % between an A100's highest and lowest clocks).
A change that lands in microseconds (the emulator without a switching latency; a GPU whose
driver applies clocks at once) leaves every millisecond instruction clear of it."""

MAX_UNSURE_CLOCK_SHARE = 0.02
"""A rank's energy windows of a round count for the power fit only while at most this share
of its busy seconds ran at a clock that cannot be known (`unsure_clock_share`): charged to a
clock the GPU may not have run, they would move a row's power by up to this share times
the power between two clocks (under 1 % of the row)."""


@dataclass(frozen=True)
class WindowRow:
    """One energy window, its busy seconds keyed by unit (`Parallel3D.measure` maps them)."""

    energy_j: float
    time_s: float
    busy: Mapping[Unit, float]
    tail_s: float = 0.0
    tail_busy: Mapping[Unit, float] = field(default_factory=dict)
    after: Mapping[Unit, tuple[float, ...]] = field(default_factory=dict)
    """Per unit, the idle seconds in each band after its work stopped (`EnergyWindow.after_s`)."""
    tail_after: Mapping[Unit, tuple[float, ...]] = field(default_factory=dict)


StagePlan = list[list[tuple[str, int]]]
"""Per pipeline rank, the (instruction, freq_mhz) list of one iteration in execution order."""


@dataclass(frozen=True)
class StageMeasurement:
    """One round's numbers for one pipeline rank (see the module docstring for the 3D rule).

    `time_s`/`energy_j`: per instruction kind, the mean over the window's iterations and
    the kind's occurrences on the rank (all its stages). `busy_s`/`compute_energy_j`: per
    iteration, the rank's total instruction time (busiest copy) and energy (tp ranks of the
    first pipeline).
    """

    time_s: dict[str, float]
    energy_j: dict[str, float]
    busy_s: float
    compute_energy_j: float
    iteration_energy_j: float


@dataclass(frozen=True)
class VirtualStageMeasurement:
    """One round's numbers for one pipeline (virtual) stage: per kind the stage runs, the
    mean over the window's iterations and the kind's occurrences on that stage (time: max
    over the stage's copies; energy: sum over the tp ranks of the first pipeline)."""

    rank: int
    """The pipeline rank that holds the stage."""
    time_s: dict[str, float]
    energy_j: dict[str, float]


@dataclass(frozen=True)
class RoundMeasurement:
    """One complete round (every rank reported), aggregated.

    Attributes:
        stages: One entry per pipeline rank.
        virtual_stages: One entry per pipeline (virtual) stage, the profile's unit.
        iteration_time_s: Mean iteration time, max over all ranks.
        pipeline_energy_j: Mean iteration energy of one pipeline (first dp pipeline, all
            its GPUs).
        job_energy_j: Mean iteration energy of all GPUs of the job.
        busy_s: (dp_rank, pp_rank) → per-iteration instruction time of that stage copy
            (its busiest tp rank); used to spot a slow data-parallel pipeline.
        p2p_power_w: The median over ranks of the power a GPU drew while not computing,
            ``(iter_energy − Σ eᵢ) / (iter_time − Σ tᵢ)``, or None if no rank had idle time.
        iterations: Iterations in the round (the most any rank ran).
        windows: Per rank, its energy windows keyed by unit (ranks that sent none: absent).
        unit_time: Per rank, per unit it ran, (total seconds, count) over the round.
        landing_only: Per rank, the units of `unit_time` none of whose instructions ran
            clear of a clock change in the round (their times hold seconds at the old
            clock: `landing_only_units`).
        typical_iteration_time_s: Median iteration time, max over all ranks (None: not
            given, `iteration_time_s` stands for it). What the promise guard compares: one
            iteration stalled by the host (a garbage collection, a busy CPU) does not move
            it, a plan that runs slower does (every iteration of its rounds).
    """

    stages: list[StageMeasurement]
    virtual_stages: list[VirtualStageMeasurement]
    iteration_time_s: float
    pipeline_energy_j: float
    job_energy_j: float
    busy_s: dict[tuple[int, int], float]
    p2p_power_w: float | None
    iterations: int = 1
    windows: dict[int, list[WindowRow]] = field(default_factory=dict)
    unit_time: dict[int, dict[Unit, tuple[float, int]]] = field(default_factory=dict)
    landing_only: dict[int, frozenset[Unit]] = field(default_factory=dict)
    typical_iteration_time_s: float | None = None

    @property
    def typical_time_s(self) -> float:
        """`typical_iteration_time_s`, or the mean where it was not given."""
        t = self.typical_iteration_time_s
        return self.iteration_time_s if t is None else t


def unit_time(m: RoundMeasurement, stage: int, kind: str, freq: int, fallback_s: float) -> float:
    """The round's time of (stage, kind) at `freq`: the slowest rank's mean over the
    instructions that ran clear of a clock change (`RoundMeasurement.unit_time`; an
    instruction that starts while a change lands runs partly at the old clock), else
    `fallback_s`, the stage's mean over all its instructions."""
    means = [
        total / count
        for times in m.unit_time.values()
        if (acc := times.get((stage, kind, freq))) is not None
        for total, count in (acc,)
        if count > 0
    ]
    return max(means) if means else fallback_s


def measured_unit_time(
    m: RoundMeasurement, stage: int, kind: str, freq: int, fallback_s: float
) -> tuple[float, bool]:
    """`unit_time` over the ranks that ran (stage, kind) at `freq` clear of a clock change,
    and True; where every rank that ran it did so only while a change was landing
    (`RoundMeasurement.landing_only`), `unit_time` and False: the time holds seconds at
    another clock. A round without per-unit times (an older client) counts as the clock's
    own."""
    unit = (stage, kind, freq)
    clear = [
        total / count
        for rank, times in m.unit_time.items()
        if unit in times and unit not in m.landing_only.get(rank, ())
        for total, count in (times[unit],)
        if count > 0
    ]
    if clear:
        return max(clear), True
    ran = any(unit in times for times in m.unit_time.values())
    return unit_time(m, stage, kind, freq, fallback_s), not ran


def _landing_s(lag_s: float, since_s: float, t: float) -> float:
    """The seconds of an instruction of `t` seconds, started `since_s` after a change
    began, that ran before the change landed (`lag_s` after it began)."""
    return min(max(lag_s - since_s, 0.0), t)


def _instruction_runs(
    units: list[Unit],
    where: dict[str, list[int]],
    time_breakdown: dict[str, list[list[float]]],
    lag_s: float,
    idle_before_s: Sequence[float] | None = None,
) -> Iterator[tuple[int, float, float, int, bool, float]]:
    """Every instruction of a round's iterations, in order: (its index in the order, its
    time, the wall seconds since the last clock change began when it started (it ran clear
    of the change from `lag_s` on), the clock in force before that change, whether that
    change is the one at the round's start, and, where the instruction begins a change
    within the round, the wall seconds the change before it had had to land (else
    infinity)). A change begins at the start of the round's
    first instruction (the clocks may have changed since the last round; the clock before
    is then taken as this iteration's last) and of every instruction whose clock differs
    from the one before (wrapping around the iteration): a rank asks for an instruction's
    clock when the GPU starts it.

    `idle_before_s` (`ProfilingResult.idle_before_s`): per index, the seconds the GPU was
    idle before the instruction started (pipeline bubbles, waits for a peer, the optimizer
    step); they count towards the landing, as the switch goes on while the GPU waits. None
    (an older client): busy seconds only, which counts a change as landing later than it
    does."""
    n = len(units)
    gaps = None  # an index past the list's end was never idle before it
    if idle_before_s is not None and len(idle_before_s) <= n:
        gaps = [*idle_before_s, *[0.0] * (n - len(idle_before_s))]
    iterations = max((len(v) for v in time_breakdown.values()), default=0)
    since = 0.0  # wall seconds since the last clock change began
    before = 0
    at_start = True
    for it in range(iterations):
        durations: list[float | None] = [None] * n
        for kind, iters in time_breakdown.items():
            if it < len(iters):
                for index, t in zip(where.get(kind, ()), iters[it], strict=False):
                    durations[index] = t
        for index, t in enumerate(durations):
            if t is None:
                continue
            previous_s = math.inf
            if it == 0 and index == 0:
                since, before = 0.0, units[-1][2]
            elif units[index][2] != units[index - 1][2]:
                previous_s = since + (gaps[index] if gaps is not None else 0.0)
                since, before, at_start = 0.0, units[index - 1][2], False
            elif gaps is not None:
                since += gaps[index]
            yield index, t, since, before, at_start, previous_s
            since += t


def clean_unit_times(
    units: list[Unit],
    where: dict[str, list[int]],
    time_breakdown: dict[str, list[list[float]]],
    lag_s: float,
    idle_before_s: Sequence[float] | None = None,
) -> dict[Unit, tuple[float, int]]:
    """Per unit, its instructions' total time and count over a round's iterations, leaving
    out those that ran while a clock change was being applied.

    A GPU takes `lag_s` (the rank's measured switch latency) to apply a new clock; an
    instruction that starts within that of a change (its own, a predecessor's, or the
    round's start, when the clocks may have changed since the last round) runs partly at the
    old clock, and its time is not its clock's (unless the landing was at most
    `MAX_LANDING_SHARE` of it). Such instructions count only for a unit that has no other
    instruction in the round. `idle_before_s`: as in `_instruction_runs`
    (the landing counted in wall time)."""
    return round_unit_times(units, where, time_breakdown, lag_s, idle_before_s)[0]


def round_unit_times(
    units: list[Unit],
    where: dict[str, list[int]],
    time_breakdown: dict[str, list[list[float]]],
    lag_s: float,
    idle_before_s: Sequence[float] | None = None,
) -> tuple[dict[Unit, tuple[float, int]], frozenset[Unit]]:
    """`clean_unit_times` and `landing_only_units` of one round, from one pass over its
    instructions (a coordinator computes both for every rank of every round)."""
    clean, every = _clear_and_all(units, where, time_breakdown, lag_s, idle_before_s)
    times = {
        u: (total, int(count)) for u, (total, count) in ((u, clean.get(u, every[u])) for u in every)
    }
    return times, frozenset(every.keys() - clean.keys())


def _clear_and_all(
    units: list[Unit],
    where: dict[str, list[int]],
    time_breakdown: dict[str, list[list[float]]],
    lag_s: float,
    idle_before_s: Sequence[float] | None,
) -> tuple[dict[Unit, list[float]], dict[Unit, list[float]]]:
    """Per unit, [total seconds, count] of its instructions that ran clear of a clock
    change, and of all of them (`clean_unit_times`)."""
    clean: dict[Unit, list[float]] = {}
    every: dict[Unit, list[float]] = {}
    runs = _instruction_runs(units, where, time_breakdown, lag_s, idle_before_s)
    for index, t, since, _, _, _ in runs:
        unit = units[index]
        landing_s = _landing_s(lag_s, since, t)
        for acc in (every, clean) if landing_s <= MAX_LANDING_SHARE * t else (every,):
            total = acc.setdefault(unit, [0.0, 0.0])
            total[0] += t
            total[1] += 1
    return clean, every


def landing_only_units(
    units: list[Unit],
    where: dict[str, list[int]],
    time_breakdown: dict[str, list[list[float]]],
    lag_s: float,
    idle_before_s: Sequence[float] | None = None,
) -> frozenset[Unit]:
    """The units none of whose instructions in the round ran clear of a clock change (the
    same rule as `clean_unit_times`, which gives them the time of all their instructions):
    where every instruction of a kind is preceded by a change, as when the kinds a rank
    alternates run at different clocks and last less than the switch, the GPU may never
    have run the unit's clock at all, and its time says nothing about that clock."""
    return round_unit_times(units, where, time_breakdown, lag_s, idle_before_s)[1]


def unsure_clock_share(
    units: list[Unit],
    where: dict[str, list[int]],
    time_breakdown: dict[str, list[list[float]]],
    lag_s: float,
    idle_before_s: Sequence[float] | None = None,
) -> float:
    """The share of a round's busy seconds that ran while a clock change landed which was
    asked for before the change before it had landed (`lag_s`, the rank's measured switch
    latency; `idle_before_s` as in `_instruction_runs`).

    Which clock a GPU runs then is not something the rank can know: the one asked for just
    before (as `window_shares` charges a landing), or, if a GPU restarts its switch when
    asked again, the last one that landed, several changes back (the emulator does so). Where
    a rank alternates kinds at different clocks and its instructions are shorter than its
    switch, every change is such a one, and most of its seconds are unsure: charged to
    either clock, they would pull the rows towards another clock's power (on the fidelity
    family with 10–20 ms switches, a per-row energy error of 5.5 % median and 30 % at p95 on a
    job where it was 0.8 / 3.4 % with clocks that land at once)."""
    if lag_s <= 0:
        return 0.0
    unsure = total = 0.0
    superseding = False  # the change landing now was asked for before the one before landed
    runs = _instruction_runs(units, where, time_breakdown, lag_s, idle_before_s)
    for _, t, since, _, _, previous_s in runs:
        if math.isfinite(previous_s):
            superseding = previous_s < lag_s
        if superseding:
            unsure += _landing_s(lag_s, since, t)
        total += t
    return unsure / total if total > 0 else 0.0


def window_shares(
    units: list[Unit],
    where: dict[str, list[int]],
    time_breakdown: dict[str, list[list[float]]],
    lag_s: float,
    idle_before_s: Sequence[float] | None = None,
) -> list[list[tuple[Unit, float]]]:
    """Per instruction of the order, the units its busy seconds in an energy window count
    for, with their shares: its own unit, and, where it started while a clock change made
    inside the round was landing (its kinds at different clocks), the same kind at the
    clock before the change for the seconds it ran at that clock (averaged over the round's
    iterations, each of which makes the same changes; `idle_before_s`: as in
    `_instruction_runs`, the landing in wall time).

    A GPU runs at the old clock until the change lands (`lag_s`, the rank's measured switch
    latency) and draws that clock's power: charged to its own clock, that time would pull
    the power of the row the profile is about, as it would pull the row's time
    (`clean_unit_times` leaves it out). Where no instruction of a unit ran clear of a change
    in the round, its time holds those seconds (its power does not).

    The change at the round's start is made once, not every iteration: averaged over the
    round, its seconds at the last round's clock would be charged to every window of the
    round, and pull that clock's row towards this round's power (2–3 % on an 8 ms forward
    with a 15 ms switch). A rank's windows begin once that change has landed
    (`perseus.client.gpu.meter.EnergyReader.close_round`), so its seconds are in none: they
    count for no unit here."""
    old_s: list[dict[int, float]] = [{} for _ in units]  # per previous clock
    total_s = [0.0] * len(units)
    runs = _instruction_runs(units, where, time_breakdown, lag_s, idle_before_s)
    for index, t, since, before, at_start, _ in runs:
        landing_s = _landing_s(lag_s, since, t)
        if at_start:  # the round's own change: its landing lies before the first window
            total_s[index] += t - landing_s
            continue
        total_s[index] += t
        if landing_s > 0 and before != units[index][2]:
            old_s[index][before] = old_s[index].get(before, 0.0) + landing_s
    shares = []
    for unit, old, total in zip(units, old_s, total_s, strict=True):
        stage, kind, _ = unit
        split = [((stage, kind, f), s / total) for f, s in sorted(old.items()) if total > 0]
        own = 1.0 - sum(share for _, share in split)
        shares.append([*split, (unit, own)] if own > 0 else split)
    return shares
