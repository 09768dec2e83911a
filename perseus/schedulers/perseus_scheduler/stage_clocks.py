"""Per-stage constant clocks: plans for jobs whose instructions are too short to plan one by one.

An instruction shorter than a millisecond (or than a tenth of a clock switch) cannot be
profiled or planned on its own (`perseus.schedulers.perseus_scheduler.checks.short_instructions`): the timer and the
host's wake-ups blur it, a 100 ms energy counter holds hundreds of them per refresh, and a
clock change lasts longer than several of them. A *stage* of such instructions is another
matter: its busy time per iteration is the sum of many of them, tens of milliseconds, and
its energy over a round of many iterations is what the counter shows best. So when the
all-max rounds show instructions too short, `Perseus` plans clocks per pipeline stage
instead: every instruction of a stage at one clock, which never switches within an
iteration (nothing to pay for the changes, nothing to time per instruction).

The pieces, in the order the job goes through them:

- `stage_levels`: the clocks tried, `LEVELS` of the GPUs' supported clocks from the max
  down to `FLOOR_SHARE` of it (where a GPU's energy per unit of work usually bottoms out).
- `StageClockSweep`: the rounds that measure them. Round ``j`` of repeat ``q`` runs stage
  ``r`` at level ``(j + r) mod L`` (a cyclic Latin square: every round mixes levels, so the
  job never runs all stages at the lowest clock at once, and a drift over the rounds does
  not line up with one level), each repeat in the other order; `REPEATS` repeats give every
  (stage, level) a spread. Rounds are sized by `Perseus.round_steps` to hold several of the
  counter's refreshes. From each round it keeps, per stage, the busy time per iteration
  (the sum of its instructions' measured times) and the energy per iteration; the all-max
  rounds before it give the max clock's.
- `fit_stage_curves`: per stage, the time ratio ``r(f) = busy(f) / busy(f_max)`` and the
  busy power ``P(f) = (E(f) − P_block·(T(f) − busy(f))) / busy(f)`` per level (``P_block``:
  the blocking power the all-max rounds measured), their means and standard errors over the
  repeats, made physical: ``r`` never below 1 nor falling as the clock falls (a lower clock
  is never credited with speed), and its standard error added (`TIME_Z`) so the plan's time
  errs on the slow side; ``P`` never rising as the clock falls (isotonic, weighted by the
  samples). A level whose power is not within the stage's idle power and power limit is
  left out ("no value a GPU cannot produce"); at the max clock, which every plan needs, such
  a power keeps the job at all-max (`StageCurve.unphysical_at_max`): the power its GPUs
  draw in the bubbles after work stops, which this model charges to busy time, can put a
  stage of 1 ms instructions above its GPUs' limit, and every plan's accounting would rest
  on it.
- `stage_profile`: an `InstructionProfile` scaled per stage: ``t(stage, kind, f) =
  t_max(stage, kind)·r(f)`` and ``e = t·P(f)``. Only sums over a stage's instructions
  matter to a plan that runs them all at one clock, and those are what was measured.
- `stage_clock_frontier`: the plans, scored by the pipeline's DAG with the job's hop latency
  (`perseus.planning`'s accounting, the same every plan of the job is scored with): every
  combination of one level per stage when there are at most `EXHAUSTIVE_PLANS` of them
  (4 stages × 6 levels: 1,296), else a greedy chain from all-max and a coordinate descent
  (single and paired moves) at the job's time limit. Their Pareto set is a `Frontier`, so
  the deployment, its checks (`plan_problems`: the saving must stand out of the noise),
  the guard's moves to a faster point and the reference all-max rounds work as for any plan.
- `fit_time_sensitivity`: what the DAG does not see. A rank whose host is busy between
  instructions has less slack than the DAG gives it; the rounds' median iterations say how
  much of each stage's added busy time lengthened them, and a plan's time is the larger of
  the DAG's and that (`StageLimits.sensitivity`).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from perseus.domain.profile import InstructionProfile
from perseus.domain.rows import ProfileRow
from perseus.domain.schedule import PipelineSchedule
from perseus.schedulers.measurement import RoundMeasurement, unit_time

if TYPE_CHECKING:
    from perseus.planning import Frontier

__all__ = [
    "EXHAUSTIVE_PLANS",
    "FLOOR_SHARE",
    "LEVELS",
    "REPEATS",
    "TIME_Z",
    "StageClockSweep",
    "StageCurve",
    "StageLimits",
    "StageSample",
    "fit_stage_curves",
    "fit_time_sensitivity",
    "round_levels",
    "stage_clock_frontier",
    "stage_levels",
    "stage_profile",
]

LEVELS = 6
"""Clocks tried per stage, the max clock included."""
FLOOR_SHARE = 0.58
"""The lowest clock tried, as a share of the max: below about 55-60 % of the max clock a
GPU's energy per unit of work rises again on every published profile (static power)."""
REPEATS = 2
"""Rounds per (stage, level) beyond the all-max rounds: the spread the standard errors are
taken from."""
TIME_Z = 1.0
"""Standard errors added to each measured time ratio (a plan's time errs on the slow side),
and taken off each stage's measured time share (`fit_time_sensitivity`: noise is never read
as a share)."""
EXHAUSTIVE_PLANS = 20_000
"""Up to this many combinations of one level per stage, every one is scored."""
_CHUNK_ENTRIES = 2_000_000
"""Option indices scored at once (nodes × plans) when scoring many plans."""


def stage_levels(
    frequencies: Sequence[int], *, count: int = LEVELS, floor_share: float = FLOOR_SHARE
) -> list[int]:
    """`count` of the supported `frequencies` from the max down to `floor_share` of it,
    about evenly spaced, descending (fewer when fewer are supported)."""
    freqs = sorted({int(f) for f in frequencies}, reverse=True)
    if not freqs:
        return []
    usable = [f for f in freqs if f >= floor_share * freqs[0]] or freqs[:1]
    if len(usable) <= count:
        return usable
    picked: list[int] = []
    for target in np.linspace(usable[0], usable[-1], count):
        left = [f for f in usable if f not in picked]
        picked.append(min(left, key=lambda f: (abs(f - target), -f)))
    return sorted(picked, reverse=True)


def round_levels(num_stages: int, num_levels: int, repeats: int = REPEATS) -> list[list[int]]:
    """Per round, each stage's level index (0: the max clock): `repeats` cyclic Latin
    squares (stage ``r`` at ``(j + r) mod L`` in round ``j``), every other one in reverse."""
    rounds = []
    for q in range(repeats):
        order = range(num_levels) if q % 2 == 0 else range(num_levels - 1, -1, -1)
        for j in order:
            rounds.append([(j + r) % num_levels for r in range(num_stages)])
    return rounds


@dataclass(frozen=True)
class StageSample:
    """One round's figures per pipeline stage (rank): its clock, busy time and energy per
    iteration, and the iteration's time; with `unit_s`, its instructions' mean times per
    (virtual stage, kind) and `clean_busy_s`, the busy time they add up to, both without
    the instructions that ran while the round's clock change was landing (a round that
    starts at another clock runs its first ~15 ms at the old one)."""

    freqs: tuple[int, ...]
    busy_s: tuple[float, ...]
    energy_j: tuple[float, ...]
    iteration_s: float
    unit_s: tuple[dict[tuple[int, str], float], ...] = ()
    clean_busy_s: tuple[float, ...] = ()
    typical_s: float = math.nan
    """The round's median iteration (`RoundMeasurement.typical_time_s`; nan: not known)."""

    @classmethod
    def of(
        cls, freqs: Sequence[int], m: RoundMeasurement, schedule: PipelineSchedule | None = None
    ) -> StageSample:
        """Round `m`, stage ``r`` at ``freqs[r]``; with `schedule`, its unit times too."""
        busy = tuple(s.busy_s for s in m.stages)
        if schedule is None:
            return cls(
                tuple(int(f) for f in freqs),
                busy,
                _energies(m),
                m.iteration_time_s,
                typical_s=m.typical_time_s,
            )
        units: list[dict[tuple[int, str], float]] = [{} for _ in m.stages]
        clean = [0.0] * len(m.stages)
        counts = Counter((i.rank, i.stage, i.kind) for order in schedule.orders for i in order)
        for v, vs in enumerate(m.virtual_stages):
            for kind, t in vs.time_s.items():
                t_clean = unit_time(m, v, kind, int(freqs[vs.rank]), t)
                units[vs.rank][v, kind] = t_clean
                clean[vs.rank] += counts[vs.rank, v, kind] * t_clean
        return cls(
            tuple(int(f) for f in freqs),
            busy,
            _energies(m),
            m.iteration_time_s,
            tuple(units),
            tuple(c if c > 0 else b for c, b in zip(clean, busy, strict=True)),
            m.typical_time_s,
        )


def _energies(m: RoundMeasurement) -> tuple[float, ...]:
    return tuple(s.iteration_energy_j for s in m.stages)


class StageClockSweep:
    """The per-stage clock rounds (see the module docstring).

    Args:
        schedule: The job's pipeline (its stages are its pipeline ranks).
        levels: The clocks tried, descending (`stage_levels`); levels[0] is the max.
        repeats: Latin squares run.
    """

    def __init__(
        self, schedule: PipelineSchedule, levels: Sequence[int], repeats: int = REPEATS
    ) -> None:
        self.schedule = schedule
        num_stages = self.num_stages = schedule.num_stages
        self.levels = list(levels)
        self.rounds = round_levels(num_stages, len(self.levels), repeats)
        self.step = 0
        self.samples: list[StageSample] = []
        """The sweep's rounds, then (`add_all_max`) the all-max rounds."""

    @property
    def done(self) -> bool:
        return self.step >= len(self.rounds)

    def rounds_left_estimate(self) -> int:
        return max(0, len(self.rounds) - self.step)

    def current_freqs(self) -> list[int]:
        """Each stage's clock in the round being issued (the max once done)."""
        if self.done:
            return [self.levels[0]] * self.num_stages
        return [self.levels[k] for k in self.rounds[self.step]]

    def observe(self, m: RoundMeasurement | None) -> None:
        """The round issued last (None: incomplete, run again)."""
        if m is None or self.done:
            return
        self.samples.append(StageSample.of(self.current_freqs(), m, self.schedule))
        self.step += 1

    def add_all_max(self, m: RoundMeasurement) -> None:
        """An all-max round measured before the sweep: the max clock's figures."""
        self.samples.append(StageSample.of([self.levels[0]] * self.num_stages, m, self.schedule))


@dataclass(frozen=True)
class StageCurve:
    """One stage's fitted clocks: per kept level (descending, the max first) its busy time's
    ratio to the max clock's and each of its (virtual stage, kind)'s (standard error added,
    `TIME_Z`), and its busy power (all its GPUs)."""

    stage: int
    freqs: list[int]
    time_ratio: list[float]
    time_ratio_se: list[float]
    power_w: list[float]
    power_se_w: list[float]
    samples: list[int]
    unit_ratio: dict[tuple[int, str], list[float]] = field(default_factory=dict)
    """Per (virtual stage, kind) of the stage, its time ratio at each kept level (absent:
    the busy time's stands for it)."""
    left_out: list[str] = field(default_factory=list)
    """Levels left out, each with why."""
    unphysical_at_max: str | None = None
    """Why the max clock's busy power is one the stage's GPUs cannot draw (None: they can).
    The max clock is never left out (all-max needs it): a job with such a stage keeps
    all-max (`Perseus._start_solve`)."""

    def describe(self) -> str:
        pairs = ", ".join(
            f"{f} MHz ×{r:.3f} {p:.0f} W"
            for f, r, p in zip(self.freqs, self.time_ratio, self.power_w, strict=True)
        )
        return f"stage {self.stage}: {pairs}"

    def ratio(self, unit: tuple[int, str]) -> list[float]:
        """`unit`'s time ratio at each kept level."""
        return self.unit_ratio.get(unit, self.time_ratio)


def _isotonic(values: Sequence[float], weights: Sequence[float]) -> list[float]:
    """The weighted least-squares non-decreasing fit of `values` (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, w in zip(values, weights, strict=True):
        blocks.append([float(v), float(w), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, n2 = blocks.pop()
            m1, w1, n1 = blocks.pop()
            total = w1 + w2
            blocks.append([(m1 * w1 + m2 * w2) / total, total, n1 + n2])
    out: list[float] = []
    for mean, _, count in blocks:
        out.extend([mean] * int(count))
    return out


def _mean_se(values: list[float]) -> tuple[float, float]:
    """The mean and its standard error (nan with one value)."""
    mean = math.fsum(values) / len(values)
    if len(values) < 2:
        return mean, math.nan
    return mean, statistics.stdev(values) / math.sqrt(len(values))


def _with_pooled_se(stats: list[tuple[float, float]]) -> list[float]:
    """Each level's standard error; a level measured once takes the median relative
    spread of the others (0 when none has one)."""
    rel = [se / abs(m) for m, se in stats if math.isfinite(se) and m != 0]
    pooled = statistics.median(rel) if rel else 0.0
    return [se if math.isfinite(se) else pooled * abs(m) for m, se in stats]


def _time_ratios(
    by_freq: dict[int, list[float]], levels: Sequence[int], time_z: float
) -> tuple[list[float], list[float]] | None:
    """The time ratios to the max clock (levels[0]) of one stage or unit, at each of
    `levels`, from its times per clock (`by_freq`), and their standard errors: the
    non-decreasing fit as the clock falls (the max clock the reference, ratio 1), its
    standard error added, never below 1 nor below a higher clock's. None: not measured at
    every level."""
    if any(not by_freq.get(f) for f in levels):
        return None
    top = math.fsum(by_freq[levels[0]]) / len(by_freq[levels[0]])
    if not top > 0:
        return None
    stats = [_mean_se([t / top for t in by_freq[f]]) for f in levels]
    se = _with_pooled_se(stats)
    weights = [1e6, *(float(len(by_freq[f])) for f in levels[1:])]
    mono = _isotonic([1.0, *(m for m, _ in stats[1:])], weights)
    ratio = [1.0]
    for k in range(1, len(levels)):
        ratio.append(max(ratio[-1], mono[k] + time_z * se[k], 1.0))
    return ratio, se


def fit_stage_curves(
    samples: Sequence[StageSample],
    levels: Sequence[int],
    *,
    p2p_power_w: float,
    power_floor_w: Sequence[float | None] | None = None,
    power_cap_w: Sequence[float | None] | None = None,
    time_z: float = TIME_Z,
) -> list[StageCurve]:
    """Each stage's `StageCurve` from the rounds' `samples` (see the module docstring).

    `p2p_power_w`: a stage's blocking power (all its GPUs); `power_floor_w` /
    `power_cap_w`: per stage, the least and most power its GPUs can draw while computing
    (their idle power and power limit; None: unknown). A stage without samples at the max
    clock keeps the max clock only.
    """
    if not samples:
        return []
    num_stages = len(samples[0].busy_s)
    top = levels[0]
    curves = []
    for s in range(num_stages):
        busy: dict[int, list[float]] = {}
        powers: dict[int, list[float]] = {}
        units: dict[tuple[int, str], dict[int, list[float]]] = {}
        for x in samples:
            if not x.busy_s[s] > 0:
                continue
            f = x.freqs[s]
            busy.setdefault(f, []).append(x.clean_busy_s[s] if x.clean_busy_s else x.busy_s[s])
            idle = max(0.0, x.iteration_s - x.busy_s[s])
            powers.setdefault(f, []).append((x.energy_j[s] - p2p_power_w * idle) / x.busy_s[s])
            for unit, t in (x.unit_s[s] if x.unit_s else {}).items():
                units.setdefault(unit, {}).setdefault(f, []).append(t)
        kept = [f for f in levels if f in busy]
        fitted = _time_ratios(busy, kept, time_z) if top in kept else None
        if fitted is None:
            curves.append(StageCurve(s, [top], [1.0], [0.0], [math.nan], [math.nan], [0]))
            continue
        ratio, se_r = fitted
        stats_p = [_mean_se(powers[f]) for f in kept]
        se_p = _with_pooled_se(stats_p)
        counts = [len(busy[f]) for f in kept]
        unit_ratio = {}
        for unit, by_freq in units.items():
            per_unit = _time_ratios(by_freq, kept, time_z)
            if per_unit is not None:
                unit_ratio[unit] = per_unit[0]
        # Busy power never rises as the clock falls (the fit on the negated powers).
        power = [-p for p in _isotonic([-m for m, _ in stats_p], [float(n) for n in counts])]
        floor = power_floor_w[s] if power_floor_w is not None else None
        cap = power_cap_w[s] if power_cap_w is not None else None
        keep: list[int] = []
        left_out = []
        at_max = None
        for k, f in enumerate(kept):
            p = power[k]
            why = None
            if not p > 0:
                why = f"a busy power of {p:.1f} W"
            elif floor is not None and p < floor:
                why = f"a busy power of {p:.1f} W, below the GPUs' idle {floor:.1f} W"
            elif cap is not None and p > cap:
                why = f"a busy power of {p:.1f} W, above the GPUs' limit {cap:.1f} W"
            if why is not None and k > 0:
                left_out.append(f"{f} MHz ({why})")
            else:
                keep.append(k)
                at_max = why if k == 0 else at_max
        curves.append(
            StageCurve(
                s,
                [kept[k] for k in keep],
                [ratio[k] for k in keep],
                [se_r[k] for k in keep],
                [power[k] for k in keep],
                [se_p[k] for k in keep],
                [counts[k] for k in keep],
                {u: [r[k] for k in keep] for u, r in unit_ratio.items()},
                left_out,
                at_max,
            )
        )
    return curves


def stage_profile(
    max_times_s: dict[tuple[int, str], float],
    curves: Sequence[StageCurve],
    schedule: PipelineSchedule,
    *,
    ranks: Sequence[tuple[int, int, int, int]],
    emulated: bool,
    source: str,
) -> InstructionProfile:
    """The profile scaled per stage: ``t = t_max·r(f)`` (the unit's own ratio where it was
    measured at every level, else its stage's busy time's) and ``e = t·P(f)`` for every
    (virtual stage, kind) in `max_times_s` (its time at the max clock) and every level its
    pipeline stage's curve kept. `ranks`: per pipeline stage, (rank, dp_rank, pp_rank,
    tp_rank) of the GPU that stands for it."""
    rows = []
    for (stage, kind), t_max in sorted(max_times_s.items()):
        curve = curves[schedule.stage_ranks[stage]]
        rank, dp, pp, tp = ranks[schedule.stage_ranks[stage]]
        for f, r, r_se, p, p_se in zip(
            curve.freqs,
            curve.ratio((stage, kind)),
            curve.time_ratio_se,
            curve.power_w,
            curve.power_se_w,
            strict=True,
        ):
            t = t_max * r
            e = t * p
            rel = math.hypot(r_se / r, p_se / p) if r > 0 and p > 0 else math.inf
            rows.append(ProfileRow(rank, dp, pp, tp, stage, kind, f, t, e, emulated, True, e * rel))
    return InstructionProfile.from_rows(rows, source=source, check_power=False)


# ---------------------------------------------------------------------- the plans
def _ladders(problem: Any) -> tuple[list[list[int]], list[list[np.ndarray]]]:
    """Per pipeline stage, the clocks every one of its nodes was profiled at (descending)
    and each clock's option indices of its nodes."""
    pb = problem.solver
    clocks: list[list[int]] = []
    choices: list[list[np.ndarray]] = []
    for idx in problem.stage_index:
        types = pb.type_of[idx]
        common = set.intersection(
            *(set(int(x) for x in pb.type_options[t].label) for t in set(types.tolist()))
        )
        ladder = sorted(common, reverse=True)
        clocks.append(ladder)
        choices.append(
            [
                np.array(
                    [int(np.flatnonzero(pb.type_options[t].label == f)[0]) for t in types],
                    dtype=np.int64,
                )
                for f in ladder
            ]
        )
    return clocks, choices


class StageLimits(NamedTuple):
    """What a per-stage solve aims at: the time limit (`deadline_s`, else ``(1 +
    max_slowdown)·T(all-max)``) and each stage's measured time sensitivity
    (`fit_time_sensitivity`; None: the DAG's times alone)."""

    deadline_s: float | None
    max_slowdown: float
    sensitivity: tuple[float, ...] | None = None


def fit_time_sensitivity(samples: Sequence[StageSample]) -> tuple[float, ...] | None:
    """Per stage, the share of its added busy time (over the max clock's) that the rounds'
    median iteration grew by: ``ΔT ≈ Σ_s a_s·Δbusy_s``, least squares with ``0 ≤ a_s ≤ 1``
    over the per-stage rounds (their clocks mix levels, so the stages' shares separate).

    The DAG gives a stage the slack its peers leave it; a rank whose host is busy between
    instructions (launches, sends, Python) has less, and its slower instructions lengthen
    the iteration more than the DAG says. Plans are scored with the larger of the two.

    Each share is taken one standard error low (`TIME_Z`; the errors from the fit's own
    residuals): on a host whose iterations vary more than the clocks move them, the rounds
    cannot tell a stage's share from noise, and the DAG's timing stands (the guard measures
    the plan either way). None: too few rounds (fewer than two per stage beyond the all-max
    ones)."""
    if not samples:
        return None
    top = max(max(x.freqs) for x in samples)
    num_stages = len(samples[0].busy_s)
    at_max = [x for x in samples if all(f == top for f in x.freqs)]
    others = [x for x in samples if any(f != top for f in x.freqs)]
    if not at_max or len(others) < 2 * num_stages:
        return None

    def busy(x: StageSample, s: int) -> float:
        return x.clean_busy_s[s] if x.clean_busy_s else x.busy_s[s]

    base_t = [x.typical_s for x in at_max if math.isfinite(x.typical_s)]
    if not base_t:
        return None
    t0 = statistics.median(base_t)
    b0 = [statistics.fmean(busy(x, s) for x in at_max) for s in range(num_stages)]
    rows = [x for x in others if math.isfinite(x.typical_s)]
    if len(rows) < 2 * num_stages:
        return None
    a = np.array([[busy(x, s) - b0[s] for s in range(num_stages)] for x in rows])
    y = np.array([x.typical_s - t0 for x in rows])
    from scipy.optimize import lsq_linear

    fit = lsq_linear(a, y, bounds=(0.0, 1.0))
    dof = len(rows) - num_stages
    sigma2 = float(np.sum((y - a @ fit.x) ** 2)) / max(dof, 1)
    try:
        se = np.sqrt(np.clip(np.diag(np.linalg.pinv(a.T @ a)) * sigma2, 0.0, None))
    except np.linalg.LinAlgError:
        return None
    return tuple(float(v) for v in np.clip(fit.x - TIME_Z * se, 0.0, 1.0))


class _Scorer:
    """Scores plans of one clock level per stage: the DAG's accounting, and where the
    stages' measured time sensitivity says the iteration grows more, that time (its
    blocking energy included)."""

    def __init__(self, problem: Any, sensitivity: Sequence[float] | None) -> None:
        self.problem = problem
        self.clocks, self.choices = _ladders(problem)
        self.sizes = [len(c) for c in self.choices]
        pb = problem.solver
        self.busy = [
            [float(pb.opt_time[pb.type_of[idx], ch].sum()) for ch in self.choices[s]]
            for s, idx in enumerate(problem.stage_index)
        ]
        self.sensitivity = None if sensitivity is None else list(sensitivity)
        self.reference_s = 0.0
        if self.sensitivity is not None:
            (t0,), _ = self.dag([[0] * len(self.sizes)])
            self.reference_s = float(t0)

    def choice(self, levels: Sequence[int]) -> np.ndarray:
        out = np.empty(self.problem.solver.n, dtype=np.int64)
        for s, (idx, k) in enumerate(zip(self.problem.stage_index, levels, strict=True)):
            out[idx] = self.choices[s][k]
        return out

    def dag(self, combos: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
        """(times, energies) of `combos` on the DAG, in chunks (`exact=False`: ranking)."""
        pb = self.problem.solver
        per_chunk = max(1, _CHUNK_ENTRIES // max(1, pb.n))
        times, energies = [], []
        for start in range(0, len(combos), per_chunk):
            part = combos[start : start + per_chunk]
            matrix = np.stack([self.choice(c) for c in part], axis=1)
            t, e, _, _ = pb.account(matrix, exact=False)
            times.append(t)
            energies.append(e)
        return np.concatenate(times), np.concatenate(energies)

    def extra_s(self, combos: Sequence[Sequence[int]], times: np.ndarray) -> np.ndarray:
        """Seconds the measured sensitivity adds to each plan's DAG time (0: none)."""
        if self.sensitivity is None:
            return np.zeros(len(combos))
        added = np.array(
            [
                sum(
                    a * (self.busy[s][k] - self.busy[s][0])
                    for s, (a, k) in enumerate(zip(self.sensitivity, c, strict=True))
                )
                for c in combos
            ]
        )
        return np.maximum(self.reference_s + added - times, 0.0)

    def __call__(self, combos: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
        """(times, energies) of `combos` (see the class docstring)."""
        times, energies = self.dag(combos)
        extra = self.extra_s(combos, times)
        blocking = self.problem.solver.p2p_power_w * len(self.sizes)
        return times + extra, energies + blocking * extra


def _descend(
    score: _Scorer,
    start: list[int],
    limit_s: float,
    max_passes: int = 200,
) -> list[int]:
    """Coordinate descent from `start`: the change of one stage's level that saves the most
    energy with ``T ≤ limit_s``; where none does, the change of two stages' levels (one
    slower, one faster: slack moved where it saves more); until neither saves."""
    current = list(start)
    _, (e0,) = score([current])
    e_cur = float(e0)
    for _ in range(max_passes):
        moved = False
        for moves in (_single_moves, _paired_moves):
            combos = moves(current, score.sizes)
            if not combos:
                continue
            times, energies = score(combos)
            ok = times <= limit_s * (1 + 1e-9)
            best = int(np.argmin(np.where(ok, energies, np.inf)))
            if ok[best] and energies[best] < e_cur * (1 - 1e-12):
                current, e_cur = combos[best], float(energies[best])
                moved = True
                break
        if not moved:
            break
    return current


def _single_moves(current: list[int], sizes: list[int]) -> list[list[int]]:
    return [
        [*current[:s], k, *current[s + 1 :]]
        for s, n in enumerate(sizes)
        for k in range(n)
        if k != current[s]
    ]


def _paired_moves(current: list[int], sizes: list[int]) -> list[list[int]]:
    out = []
    for s, u in itertools.combinations(range(len(sizes)), 2):
        for k in range(sizes[s]):
            for j in range(sizes[u]):
                if k != current[s] and j != current[u]:
                    c = list(current)
                    c[s], c[u] = k, j
                    out.append(c)
    return out


def _chain(score: _Scorer, max_time_s: float) -> list[list[int]]:
    """From all-max, lower one stage by one level at a time: the step that saves the most
    energy per second of iteration time added (those adding none first), while one saves
    within `max_time_s`."""
    sizes = score.sizes
    current = [0] * len(sizes)
    (t0,), (e0,) = score([current])
    t_cur, e_cur = float(t0), float(e0)
    out: list[list[int]] = []
    while True:
        combos = [
            [*current[:s], current[s] + 1, *current[s + 1 :]]
            for s in range(len(sizes))
            if current[s] + 1 < sizes[s]
        ]
        if not combos:
            break
        times, energies = score(combos)
        saving = e_cur - energies
        ok = (saving > 0) & (times <= max_time_s)
        if not ok.any():
            break
        added = np.maximum(times - t_cur, 0.0)
        ratio = np.where(ok, added / np.where(ok, saving, 1.0), np.inf)
        tied = np.flatnonzero(ratio == ratio.min())
        k = int(tied[np.argmax(saving[tied])])
        current, t_cur, e_cur = combos[k], float(times[k]), float(energies[k])
        out.append(list(current))
    return out


def stage_clock_frontier(
    profile: InstructionProfile,
    schedule: PipelineSchedule,
    p2p_power_w: float,
    *,
    switch_latency_s: float,
    hop_latency_s: float,
    deadline_s: float | None = None,
    max_slowdown: float = 0.0,
    sensitivity: Sequence[float] | None = None,
    max_points: int = 500,
) -> Frontier:
    """The Pareto set of per-stage constant-clock plans of `profile` (see the module
    docstring), the all-max plan its reference. The time limit the coordinate descent
    aims at is `deadline_s`, else ``(1 + max_slowdown)·T(all-max)``; `sensitivity`
    (`fit_time_sensitivity`): each point's time is the larger of the DAG's and the one the
    rounds measured, its energy with the blocking power of the difference."""
    from perseus.planning import Frontier as FrontierCls
    from perseus.planning import FrontierPoint, PipelineProblem

    problem = PipelineProblem(profile, schedule, p2p_power_w, hop_latency_s=hop_latency_s)
    pb = problem.solver
    score = _Scorer(problem, sensitivity)
    sizes = score.sizes
    (t_max,), _ = score([[0] * len(sizes)])
    limit_s = deadline_s if deadline_s is not None else (1.0 + max_slowdown) * float(t_max)
    combos: list[list[int]]
    if math.prod(sizes) <= EXHAUSTIVE_PLANS:
        combos = [list(c) for c in itertools.product(*(range(n) for n in sizes))]
    else:
        chain = _chain(score, max(limit_s, 1.25 * float(t_max)))
        start = [0] * len(sizes)
        if chain:  # the cheapest chain plan within the limit
            times, energies = score(chain)
            ok = times <= limit_s * (1 + 1e-9)
            if ok.any():
                start = chain[int(np.argmin(np.where(ok, energies, np.inf)))]
        combos = [[0] * len(sizes), *chain, _descend(score, start, limit_s)]
    times, energies = score(combos)
    order = np.lexsort((energies, times))
    kept: list[int] = []
    for j in order:
        if not kept or energies[j] < energies[kept[-1]]:
            kept.append(int(j))
    if len(kept) > max_points:  # thin evenly, keeping both ends and the best within the limit
        within = [j for j in kept if times[j] <= limit_s * (1 + 1e-9)]
        best = min(within, key=lambda j: energies[j]) if within else kept[0]
        pick = {kept[round(x)] for x in np.linspace(0, len(kept) - 1, max_points - 1)}
        kept = sorted(pick | {best}, key=lambda j: times[j])
    chosen = [[0] * len(sizes), *(combos[j] for j in kept)]
    matrix = np.stack([score.choice(c) for c in chosen], axis=1)
    exact_t, exact_e, exact_c, _ = pb.account(matrix)
    extra = score.extra_s(chosen, exact_t)
    exact_t = exact_t + extra
    exact_e = exact_e + pb.p2p_power_w * len(sizes) * extra
    labels = pb.choices_to_labels(matrix)
    points = [
        FrontierPoint(
            float(exact_t[j]),
            float(exact_e[j]),
            math.nan,
            [labels[idx, j].astype(np.int32) for idx in problem.stage_index],
            compute_energy_j=float(exact_c[j]),
        )
        for j in range(labels.shape[1])
    ]
    stats = {"plans_scored": float(len(combos)), "per_stage": 1.0}
    if sensitivity is not None:
        stats |= {f"sensitivity_{s}": float(a) for s, a in enumerate(sensitivity)}
    return FrontierCls(
        points[1:],
        schedule=schedule,
        p2p_power_w=p2p_power_w,
        stats=stats,
        all_max=points[0],
        emulated=profile.emulated,
        switch_latency_s=switch_latency_s,
        hop_latency_s=problem.hop_latency_s,
    )
