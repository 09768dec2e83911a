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

from perseus.client.place import RankPlace
from perseus.protocol import FrequencySchedule

__all__ = ["TRACE_DIR_ENV", "Trace", "job_record", "schedule_record"]

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
        """The trace of `rank` under `trace_dir` (``ClientSettings.trace_dir``, from
        ``PERSEUS_TRACE_DIR``); None when there is none."""
        if trace_dir is None or not str(trace_dir):
            return None
        return cls(Path(trace_dir) / f"rank{rank}.jsonl")

    def write(self, record: dict[str, Any]) -> None:
        """Append one record."""
        self._file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        """Close the file (idempotent)."""
        self._file.close()


def job_record(job_id: str, place: RankPlace, leader: int, emulated: bool) -> dict[str, Any]:
    """The trace's first record: the job, where this rank sits, and its leader."""
    record: dict[str, Any] = {"kind": "job", "job_id": job_id, "rank": place.rank}
    record.update(leader=leader, dp_rank=place.dp_rank, pp_rank=place.pp_rank)
    record["tp_rank"] = place.tp_rank
    if emulated:
        record["emulated"] = True  # the trace's times and energies are a model's
    return record


def schedule_record(
    round_: int,
    step: int,
    frequencies: list[int],
    *,
    leader: int,
    handed: FrequencySchedule | None = None,
) -> dict[str, Any]:
    """A round's schedule as this rank runs it (`handed`: what a leader gave its group)."""
    record: dict[str, Any] = {"kind": "schedule", "round": round_, "step": step}
    record.update(frequencies=frequencies, leader=leader)
    if handed is not None:
        record["handed_out"] = {
            "frequencies": handed.frequencies,
            "replica_frequencies": handed.replica_frequencies,
        }
    return record
