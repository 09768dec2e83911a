"""The per-rank client: `PerseusOptimizer`, the hook a training job calls on every rank.

Modules, one concern each:

- `hook`: `PerseusOptimizer`, the hook's state machine (steps, instructions, rounds).
- `coordinator`: `CoordinatorClient`, the coordinator's HTTP API, errors mapped to
  `perseus.errors`.
- `bootstrap`: the torch.distributed side: layout checks, the process group, and how rank 0
  shares the job id.
- `frequency`: `FrequencyController`, the worker thread that locks the GPU's SM clock.
- `schedule`: `ScheduleValidator`, a rank's schedule on arrival and the order it executes.
- `emulation`: `InstructionEmulator` and `EmulationSettings`, for GPUs with a `stand_in`.
- `sensing`: `CounterPoller`, which watches the energy counter refresh, and
  `energy_windows`, a round cut at those refreshes (what the coordinator fits energies to).
- `timing`: `EventTimer`, instruction times from CUDA events.
- `trace`: per-rank JSONL traces (``PERSEUS_TRACE_DIR``).

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
    from perseus.client.schedule import ScheduleValidator
    from perseus.client.trace import TRACE_DIR_ENV

__all__ = [
    "CoordinatorClient",
    "EmulationSettings",
    "FrequencyController",
    "InstructionEmulator",
    "PerseusOptimizer",
    "ScheduleValidator",
    "TRACE_DIR_ENV",
]

_WHERE = {
    "CoordinatorClient": "coordinator",
    "EmulationSettings": "emulation",
    "FrequencyController": "frequency",
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
