"""The `Perseus` scheduler (``PERSEUS_SCHEDULER=Perseus``) and the parts it owns.

- `scheduler`: `Perseus`, the loop: all-max rounds, the profile, the frontier, the deployed
  plan, its promise kept.
- `args`: `PerseusArgs`, its arguments; `phase`: `PerseusPhase`, where the loop is.
- Profiling: `profiling_progress` (how far profiling is, in rounds and iterations), `checks`
  (a profile or plan the job could not measure keeps all-max, saying why), `stage_clocks`
  (per-stage clocks for instructions too short for per-instruction ones), `costs` (the
  clock-switch and P2P hop latencies the profile does not hold). The instruction sweep is
  `perseus.schedulers.sweep`.
- Deploying: `plan_model` (the profile, its costs and its frontier as one model that scores
  plans), `solving` (the frontier's solve, here or in a process of `solve_pool`, and the
  choice of the point to deploy).
- Keeping the promise: `promise` (the deployed plan's rounds against the all-max ones, and the
  record), `guard` (`PromiseGuard`: keep, move to a faster plan, fall back, re-deploy),
  `drift` (a re-profile when the GPUs drift from their profile), `stragglers` (cheaper plans
  for the pipelines a straggler holds up), `story` (``promise.jsonl``, bounded).

Names are imported on first use (PEP 562): importing a part does not import the scheduler.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perseus.schedulers.perseus_scheduler.args import PerseusArgs
    from perseus.schedulers.perseus_scheduler.phase import PerseusPhase
    from perseus.schedulers.perseus_scheduler.scheduler import Perseus

__all__ = ["Perseus", "PerseusArgs", "PerseusPhase"]

_WHERE = {"Perseus": "scheduler", "PerseusArgs": "args", "PerseusPhase": "phase"}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
