"""Per-rank traces: one JSON object a line in ``{trace_dir}/rank{R}.jsonl``.

Records, in order: ``job`` (the job id), then per round a ``schedule``, per instruction an
``instruction`` (time and clock; ``stage`` and ``microbatch`` when the caller names them;
with emulation also ``compute_s``; no energy: no GPU shows one instruction's) and per
iteration a ``step`` (time and energy). `perseus.demo.read_traces` reads them back.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["TRACE_DIR_ENV", "Trace"]

TRACE_DIR_ENV = "PERSEUS_TRACE_DIR"
"""Environment variable: a directory where each rank writes ``rank{R}.jsonl``."""


class Trace:
    """An open ``rank{R}.jsonl``, line-buffered so that a crashed rank leaves whole lines."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("w", buffering=1)

    @classmethod
    def open(cls, trace_dir: str | os.PathLike[str] | None, rank: int) -> Trace | None:
        """The trace of `rank` under `trace_dir` (default: ``PERSEUS_TRACE_DIR``); None if unset."""
        where = trace_dir if trace_dir is not None else os.environ.get(TRACE_DIR_ENV)
        if not where:
            return None
        return cls(Path(where) / f"rank{rank}.jsonl")

    def write(self, record: dict[str, Any]) -> None:
        """Append one record."""
        self._file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        """Close the file (idempotent)."""
        self._file.close()
