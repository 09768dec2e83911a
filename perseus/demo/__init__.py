"""`perseus demo`: the whole loop on emulated GPUs, and the building blocks the e2e tests use.

The demo starts a coordinator (a real server process on loopback), runs a real `torchrun`
pipeline job (4 ranks, gloo, emulated GPUs, an uneven layer split) under
`AllMaxFrequency`, then under `Perseus` (which profiles every instruction online, solves
the time–energy frontier and deploys a plan), and compares the two.

Building blocks:

- `Coordinator`: a coordinator subprocess (``python -m perseus serve``) for one scheduler,
  started on a free loopback port and stopped on exit.
- `DemoJob` / `run_training`: a ``torchrun --standalone -m perseus.train`` job.
- `read_traces` / `summarize`: the per-rank JSONL traces the hook writes
  (``PERSEUS_TRACE_DIR``), reduced to per-step iteration time (slowest rank) and energy
  (sum over ranks).
"""

from perseus.demo.processes import (
    Coordinator,
    DemoJob,
    free_port,
    require_torch,
    run_training,
    torchrun_command,
)
from perseus.demo.run import DemoResult, run_demo
from perseus.demo.traces import RunSummary, count_steps, read_traces, summarize

__all__ = [
    "Coordinator",
    "DemoJob",
    "DemoResult",
    "RunSummary",
    "count_steps",
    "free_port",
    "read_traces",
    "require_torch",
    "run_demo",
    "run_training",
    "summarize",
    "torchrun_command",
]
