"""Checks a profile and a chosen plan must pass before the plan replaces all-max.

A plan is only as good as the numbers it was solved from. A profile the timer could not
resolve, one that says a kernel runs much faster at a lower clock, or a saving smaller than
the measurements' own spread would make the planner promise what no GPU does (a plan
"twice as fast as all-max" was deployed from such a profile). Each check returns problems,
each a sentence that says what was seen and what to change; all-max stays while there is one.

The thresholds and why:

- `MIN_INSTRUCTION_S` (1 ms): a median instruction shorter than this is within a few
  host wake-ups (tens to hundreds of µs each on a loaded host) of the timer's noise, and
  an SM clock cannot follow it either (a real GPU takes 10-20 ms to apply a clock).
  Instructions also must last at least a tenth of the measured clock switch: shorter ones
  put ten or more instructions inside every change, and no per-instruction plan can land.
  Such a job is planned per stage instead (`perseus.schedulers.perseus_scheduler.stage_clocks`: one clock per stage,
  no switch within an iteration), whose profile `profile_problems(per_stage=True)` checks.
- `MAX_SPEEDUP_BELOW_MAX` (10 %): only a power cap makes a lower clock faster, and by
  little (2 % on the published Bloom A40 profile); more is noise in the profile.
- Saving vs spread: the predicted saving must exceed twice the relative spread of the
  all-max rounds' energy, or the job cannot tell the plan's saving from noise.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from perseus.domain.profile import InstructionProfile

__all__ = [
    "MAX_SPEEDUP_BELOW_MAX",
    "MIN_INSTRUCTION_S",
    "plan_problems",
    "profile_problems",
    "short_instructions",
]

MIN_INSTRUCTION_S = 1e-3
MAX_SPEEDUP_BELOW_MAX = 0.10
_SWITCH_SHARE = 0.1
_SPREAD_FACTOR = 2.0
_FIX = (
    "profile with longer instructions (larger microbatches or more layers per stage) or "
    "more steps per round"
)


def short_instructions(times_at_max_s: Sequence[float], *, switch_latency_s: float) -> str | None:
    """Why instructions whose times at the max clock are `times_at_max_s` are too short to
    plan clocks for (None: they are long enough). The all-max rounds tell it before any
    clock is swept."""
    if not times_at_max_s:
        return None
    median_s = statistics.median(times_at_max_s)
    floor_s = max(MIN_INSTRUCTION_S, _SWITCH_SHARE * switch_latency_s)
    if median_s >= floor_s:
        return None
    why = (
        "the timer and the host's wake-ups"
        if floor_s == MIN_INSTRUCTION_S
        else f"a clock switch ({switch_latency_s * 1000:.1f} ms)"
    )
    return (
        f"instructions are too short to plan clocks for: their median at the max clock is "
        f"{median_s * 1000:.3f} ms, under the {floor_s * 1000:.1f} ms that {why} can "
        f"resolve; {_FIX}"
    )


def profile_problems(
    profile: InstructionProfile, *, switch_latency_s: float, per_stage: bool = False
) -> list[str]:
    """What makes `profile` unfit to plan from (empty: nothing). `per_stage`: the profile
    is scaled per stage from per-stage clock rounds (`perseus.schedulers.perseus_scheduler.stage_clocks`), whose
    plans switch no clock and time no instruction alone: short instructions are no problem."""
    problems: list[str] = []
    at_max: list[float] = []
    bad_values: list[str] = []
    fast: list[str] = []
    for stage, kind in profile:
        o = profile.options(stage, kind)
        if not (bool((o.time_s > 0).all()) and bool((o.energy_j > 0).all())):
            bad_values.append(f"stage {stage} {kind}")
            continue
        top = int(o.freq_mhz.argmax())
        t_max = float(o.time_s[top])
        at_max.append(t_max)
        quickest = int(o.time_s.argmin())
        speedup = 1.0 - float(o.time_s[quickest]) / t_max
        if speedup > MAX_SPEEDUP_BELOW_MAX:
            fast.append(
                f"stage {stage} {kind} at {int(o.freq_mhz[quickest])} MHz "
                f"({speedup:.0%} faster than at {int(o.freq_mhz[top])} MHz)"
            )
    if bad_values:
        problems.append(
            "the profile has non-positive times or energies for " + ", ".join(bad_values[:4])
        )
    short = None if per_stage else short_instructions(at_max, switch_latency_s=switch_latency_s)
    if short is not None:
        problems.append(short)
    if fast:
        problems.append(
            "the profile says lower clocks run much faster than the max clock, which no GPU "
            f"does beyond a few % (a power cap): {'; '.join(fast[:3])}"
            + (f" and {len(fast) - 3} more" if len(fast) > 3 else "")
            + f"; that is measurement noise: {_FIX}"
        )
    return problems


def plan_problems(
    *,
    predicted_saving: float,
    predicted_slowdown: float,
    baseline_energies_j: Sequence[float],
) -> list[str]:
    """What makes a chosen plan's promise unverifiable or implausible (empty: nothing).

    `baseline_energies_j`: the job's energy per iteration in each of its all-max rounds.
    """
    problems: list[str] = []
    if predicted_slowdown < -MAX_SPEEDUP_BELOW_MAX:
        problems.append(
            f"the plan is predicted {-predicted_slowdown:.1%} faster than all-max, more than "
            f"lower clocks can make a pipeline faster; the profile is noise: {_FIX}"
        )
    values = [e for e in baseline_energies_j if math.isfinite(e)]
    if len(values) >= 2:
        mid = statistics.median(values)
        spread = statistics.stdev(values) / mid if mid > 0 else math.inf
        if predicted_saving <= _SPREAD_FACTOR * spread:
            problems.append(
                f"the plan's predicted saving ({predicted_saving:.2%}) is not above twice the "
                f"spread of the all-max rounds' energy ({spread:.2%}): the job could not tell it "
                f"from noise; {_FIX}"
            )
    return problems
