"""The phases of the `Perseus` scheduler's state machine."""

from __future__ import annotations

import enum

__all__ = ["PerseusPhase"]


class PerseusPhase(enum.Enum):
    """PROFILING → DEPLOYED ⇄ ALL_MAX (or PROFILING → ALL_MAX).

    PROFILING: a warm-up round and `baseline_rounds` all-max rounds (the reference every
    measured saving and slowdown is taken against), then the instruction sweep (only the
    blocking power's all-max round when `profile_path` is given, nothing more when
    `p2p_power` is given too). At the end of the round that completes it, the costs are
    calibrated, the profile checked, the frontier solved and the chosen plan checked.
    DEPLOYED: every round runs the chosen plan, watched by the `PromiseGuard`; while a
    data-parallel pipeline straggles, the others run a slower, cheaper plan.
    ALL_MAX: every round runs all-max: for good when the profile or the plan failed a
    check; for the guard's cool-down when it measured the plan breaking its promise, after
    which the plan is deployed again (DEPLOYED).
    """

    PROFILING = "profiling"
    DEPLOYED = "deployed"
    ALL_MAX = "all-max"
