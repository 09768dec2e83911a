"""The per-rank client: `PerseusOptimizer`, the hook a training job calls on every rank.

Modules, one concern each:

- `hook`: `PerseusOptimizer`, the hook's state machine (steps, instructions, rounds).
- `options`: `HookOptions`, the hook's keyword options, checked once.
- `settings`: `ClientSettings`, every ``PERSEUS_*`` variable the client reads.
- `place`: `RankPlace`, a rank's validated place in its layout (or its ``DeviceMesh``).
- `registration`: the job's registration (the fan-out table, the shared job id, leaders).
- `exchange`: a round's report and next schedule, off the training thread.
- `finish`: the job's normal end, told by its first leader.
- `lifecycle`: the one rule for leaving a ``with`` block.
- `coordinator`: `CoordinatorClient`, the coordinator's HTTP API; `translate` maps httpx's
  failures and error answers to `perseus.errors`.
- `leaders`: `JobFanOut`, the in-job fan-out; `job_table` its table, `fold` how a leader
  folds its group's rounds.
- `bootstrap`: the torch.distributed side: the process group, sharing the job id, barriers.
- `rank_gpu`: `RankGPU`, the rank's GPU and what drives and measures it:
  `timing` (sync, emulated or CUDA-events timing, one interface), `events` (the CUDA-events
  mechanics), `meter` (energy readings and a round's energy windows), `sensing`
  (`CounterPoller`, the counter's refreshes), `rounds` (`RoundRecord`, what a round
  measured), `frequency` (`FrequencyController`), `emulation` (for GPUs with a `stand_in`).
- `schedule`: `ScheduleValidator`, a rank's schedule on arrival and the order it executes.
- `savings`, `console`, `trace`: the log of savings, rank 0's console log, JSONL traces.

The client depends on `perseus.protocol`, `perseus.errors` and `zeus_power.device` only
(never on the solver, the planner or the server: data flows one way). Names are imported
on first use (PEP 562), so ``import perseus.client`` is cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perseus.client.coordinator import CoordinatorClient
    from perseus.client.emulation import EmulationSettings, InstructionEmulator
    from perseus.client.frequency import FrequencyController
    from perseus.client.hook import PerseusOptimizer
    from perseus.client.options import HookOptions
    from perseus.client.schedule import ScheduleValidator
    from perseus.client.settings import ClientSettings
    from perseus.client.trace import TRACE_DIR_ENV

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
    "CoordinatorClient": "coordinator",
    "EmulationSettings": "emulation",
    "FrequencyController": "frequency",
    "HookOptions": "options",
    "InstructionEmulator": "emulation",
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
