"""The per-rank client: `PerseusOptimizer`, the hook a training job calls on every rank.

Three parts, one concern each, under the hook that composes them:

- `hook`: `PerseusOptimizer`, the hook's state machine (steps, instructions, rounds), with
  `options` (`HookOptions`, its keyword options, checked once), `schedule`
  (`ScheduleValidator`, a rank's schedule on arrival and the order it executes) and
  `savings` (the log of what a rank deploys and saves).
- `gpu/`: the rank's GPU as the hook drives and measures it. `rank_gpu` (`RankGPU`, made
  once), `timing` (sync, emulated or CUDA-events timing, one interface), `events` (the
  CUDA-events mechanics), `meter` (energy readings and a round's windows), `sensing`
  (`CounterPoller`, the counter's refreshes), `rounds` (`RoundRecord`, what a round
  measured), `frequency` (`FrequencyController`), `emulation` (for GPUs with a `stand_in`).
- `wire/`: the job and the coordinator. `coordinator` (`CoordinatorClient`, the HTTP API)
  and `translate` (httpx's failures and error answers as `perseus.errors`), `registration`
  (the fan-out table, the shared job id, leaders), `leaders` (`JobFanOut`, the in-job
  fan-out), `job_table` and `fold` (a leader's table and how it folds its group's rounds),
  `exchange` (a round's report and next schedule, off the training thread), `finish` (the
  job's normal end, told by its first leader).
- Below all three: `settings` (`ClientSettings` and `EmulationSettings`, every
  ``PERSEUS_*`` variable the client reads), `facts` (`GpuFacts`, what the GPU side states
  and the wire registers), `place` (`RankPlace`, a rank's validated place in its layout),
  `bootstrap` (the torch.distributed side), `lifecycle` (the one rule for leaving a ``with``
  block), `console` (rank 0's log) and `trace` (JSONL traces).

The GPU side and the wire never import each other (import-linter's ``client-layers``).

The client depends on `perseus.protocol`, `perseus.errors` and `zeus_power.device` only
(never on the solver, the planner or the server: data flows one way). Names are imported
on first use (PEP 562), so ``import perseus.client`` is cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perseus.client.gpu.emulation import InstructionEmulator
    from perseus.client.gpu.frequency import FrequencyController
    from perseus.client.hook import PerseusOptimizer
    from perseus.client.options import HookOptions
    from perseus.client.schedule import ScheduleValidator
    from perseus.client.settings import ClientSettings, EmulationSettings
    from perseus.client.trace import TRACE_DIR_ENV
    from perseus.client.wire.coordinator import CoordinatorClient

__all__ = [
    "ClientSettings",
    "CoordinatorClient",
    "EmulationSettings",
    "FrequencyController",
    "HookOptions",
    "InstructionEmulator",
    "PerseusOptimizer",
    "ScheduleValidator",
    "TRACE_DIR_ENV",
]

_WHERE = {
    "ClientSettings": "settings",
    "CoordinatorClient": "wire.coordinator",
    "EmulationSettings": "settings",
    "FrequencyController": "gpu.frequency",
    "HookOptions": "options",
    "InstructionEmulator": "gpu.emulation",
    "PerseusOptimizer": "hook",
    "ScheduleValidator": "schedule",
    "TRACE_DIR_ENV": "trace",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
