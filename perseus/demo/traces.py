"""The per-rank JSONL traces the hook writes (``PERSEUS_TRACE_DIR``), reduced to numbers."""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perseus.errors import PerseusError

__all__ = ["RunSummary", "count_steps", "last_step_frequencies", "read_traces", "summarize"]


def read_traces(trace_dir: str | os.PathLike[str]) -> dict[int, list[dict[str, Any]]]:
    """Every rank's trace records, by rank."""
    traces: dict[int, list[dict[str, Any]]] = {}
    for path in sorted(Path(trace_dir).glob("rank*.jsonl")):
        rank = int(path.stem.removeprefix("rank"))
        traces[rank] = [json.loads(line) for line in path.read_text().splitlines() if line]
    return traces


def count_steps(trace_dir: str | os.PathLike[str], rank: int = 0) -> int:
    """Steps rank `rank` has finished so far (for progress display)."""
    path = Path(trace_dir) / f"rank{rank}.jsonl"
    try:
        with path.open() as f:
            return sum(1 for line in f if '"kind": "step"' in line)
    except OSError:
        return 0


@dataclass(frozen=True)
class RunSummary:
    """Per-step numbers of a job: iteration time (slowest rank) and energy (all ranks)."""

    iter_time_s: list[float]
    iter_energy_j: list[float]

    @classmethod
    def from_traces(cls, traces: Mapping[int, list[dict[str, Any]]]) -> RunSummary:
        per_rank = {
            rank: {r["step"]: r for r in records if r["kind"] == "step"}
            for rank, records in traces.items()
        }
        steps = sorted(set.intersection(*(set(s) for s in per_rank.values()))) if per_rank else []
        return cls(
            iter_time_s=[max(per_rank[r][s]["iter_time_s"] for r in per_rank) for s in steps],
            iter_energy_j=[sum(per_rank[r][s]["iter_energy_j"] for r in per_rank) for s in steps],
        )

    def steady(self, last: int) -> tuple[float, float]:
        """Median iteration time and energy over the last `last` steps."""
        if len(self.iter_time_s) < last:
            raise PerseusError(f"Only {len(self.iter_time_s)} step(s) were traced, need {last}")
        return (
            statistics.median(self.iter_time_s[-last:]),
            statistics.median(self.iter_energy_j[-last:]),
        )


def summarize(trace_dir: str | os.PathLike[str], last: int) -> tuple[float, float]:
    """Median (iteration time, energy) over the last `last` steps of a traced job."""
    return RunSummary.from_traces(read_traces(trace_dir)).steady(last)


def last_step_frequencies(traces: Mapping[int, list[dict[str, Any]]]) -> dict[int, list[int]]:
    """Per rank, the frequencies its last step ran at (what the GPU was locked to)."""
    out = {}
    for rank, records in traces.items():
        instrs = [r for r in records if r["kind"] == "instruction"]
        last = instrs[-1]["step"]
        out[rank] = [r["freq_mhz"] for r in instrs if r["step"] == last]
    return out
