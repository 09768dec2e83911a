"""The job's table: one fixed row per rank, all-gathered once when the hook connects.

Each row holds a rank's coordinates, the layout, leaders per stage, steps per round and
pipeline it was given, its GPU's name, SM clocks and emulation, and its measured clock-switch
latency, as int64s (no pickling). `check_table` checks that every rank was given one layout
and one pipeline, that no two ranks claim one place, and that every GPU is of one type with
one set of SM clocks; its errors name the ranks that differ. `perseus.client.wire.leaders`
builds the groups from it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from perseus.errors import ConfigurationError
from perseus.protocol import ParallelLayout

__all__ = ["TableRow", "check_table", "decode_row", "encode_row", "ranks_text"]

_FIELDS = (
    "rank",
    "dp_rank",
    "pp_rank",
    "tp_rank",
    "dp_degree",
    "pp_degree",
    "tp_degree",
    "per_stage",
    "steps_per_round",
    "pipeline_hash",
    "emulated",
    "clocks",
    "min_mhz",
    "max_mhz",
    "clocks_hash",
    "switch_ns",
)
_NAME_BYTES = 64
_ROW = len(_FIELDS) + _NAME_BYTES // 8
_SHOWN = 8
"""Kinds of GPU (or layouts) shown in an error; the rest are counted."""


def ranks_text(ranks: Sequence[int]) -> str:
    """``[0, 2-5, 9]``: sorted ranks with consecutive runs collapsed."""
    parts: list[str] = []
    ordered = sorted(ranks)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return "[" + ", ".join(parts) + "]"


def _hash63(text: str) -> int:
    """A stable 63-bit hash of `text` (fits an int64)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 1


@dataclass(frozen=True)
class TableRow:
    """One rank's row of the job's table."""

    rank: int
    dp_rank: int
    pp_rank: int
    tp_rank: int
    dp_degree: int
    pp_degree: int
    tp_degree: int
    per_stage: int
    steps_per_round: int
    pipeline_hash: int
    emulated: int
    clocks: int
    min_mhz: int
    max_mhz: int
    clocks_hash: int
    switch_ns: int
    name: str

    def gpu(self) -> str:
        kind = self.name or "an unnamed GPU"
        if self.emulated and "emulated" not in kind:
            kind += " (emulated)"
        return f"{kind} with {self.clocks} SM clocks, {self.min_mhz}–{self.max_mhz} MHz"

    def layout(self) -> str:
        return (
            f"dp {self.dp_degree} × pp {self.pp_degree} × tp {self.tp_degree}, "
            f"{self.per_stage} leader(s) per stage, {self.steps_per_round} step(s) per round"
        )


def _differ(
    rows: Sequence[TableRow], key: Callable[[TableRow], Any], describe: Callable[[TableRow], str]
) -> str | None:
    """None when every row has the same `key`; else the kinds, the most common first, each
    with its ranks."""
    kinds: dict[Any, list[TableRow]] = {}
    for row in rows:
        kinds.setdefault(key(row), []).append(row)
    if len(kinds) < 2:
        return None
    ordered = sorted(kinds.values(), key=lambda group: (-len(group), group[0].rank))
    text = "; ".join(
        f"rank(s) {ranks_text([r.rank for r in group])}: {describe(group[0])}"
        for group in ordered[:_SHOWN]
    )
    if len(ordered) > _SHOWN:
        text += f"; and {len(ordered) - _SHOWN} more kind(s)"
    return text


def encode_row(
    *,
    rank: int,
    dp_rank: int,
    pp_rank: int,
    tp_rank: int,
    layout: ParallelLayout,
    per_stage: int,
    steps_per_round: int,
    pipeline_key: str,
    gpu_name: str,
    frequencies: Sequence[int],
    emulated: bool,
    switch_latency_s: float | None,
) -> Any:
    """This rank's row, an int64 tensor."""
    import torch

    clocks = sorted(frequencies)
    name = gpu_name.encode()[:_NAME_BYTES].ljust(_NAME_BYTES, b"\0")
    row = torch.zeros(_ROW, dtype=torch.int64)
    row[: len(_FIELDS)] = torch.tensor(
        [
            rank,
            dp_rank,
            pp_rank,
            tp_rank,
            layout.dp_degree,
            layout.pp_degree,
            layout.tp_degree,
            per_stage,
            steps_per_round,
            _hash63(pipeline_key),
            int(emulated),
            len(clocks),
            clocks[0] if clocks else 0,
            clocks[-1] if clocks else 0,
            _hash63(",".join(map(str, clocks))),
            -1 if switch_latency_s is None else round(switch_latency_s * 1e9),
        ],
        dtype=torch.int64,
    )
    row[len(_FIELDS) :] = torch.frombuffer(bytearray(name), dtype=torch.int64)
    return row


def decode_row(t: Any) -> TableRow:
    """A row of the gathered table."""
    values = [int(x) for x in t[: len(_FIELDS)].tolist()]
    name = t[len(_FIELDS) :].numpy().tobytes().rstrip(b"\0").decode(errors="replace")
    return TableRow(*values, name=name)  # type: ignore[arg-type]


def check_table(rows: Sequence[TableRow]) -> None:
    """`ConfigurationError` unless the ranks agree on layout, pipeline and GPU and no two
    share a place (messages name the ranks that differ)."""
    problem = _differ(
        rows,
        lambda r: (r.dp_degree, r.pp_degree, r.tp_degree, r.per_stage, r.steps_per_round),
        TableRow.layout,
    )
    if problem is not None:
        raise ConfigurationError(f"The job's ranks were given different layouts: {problem}")
    problem = _differ(rows, lambda r: r.pipeline_hash, lambda r: f"pipeline #{r.pipeline_hash:x}")
    if problem is not None:
        raise ConfigurationError(
            "The job's ranks were given different pipelines (schedule, stages or "
            f"microbatches): {problem}"
        )
    places: dict[tuple[int, int, int], list[int]] = {}
    for row in rows:
        places.setdefault((row.dp_rank, row.pp_rank, row.tp_rank), []).append(row.rank)
    clashes = [(p, r) for p, r in places.items() if len(r) > 1]
    if clashes:
        text = "; ".join(
            f"rank(s) {ranks_text(r)} all say (dp_rank, pp_rank, tp_rank) = {p}"
            for p, r in clashes[:_SHOWN]
        )
        raise ConfigurationError(f"The job's ranks overlap: {text}")
    problem = _differ(rows, lambda r: (r.name, r.clocks_hash, r.emulated), TableRow.gpu)
    if problem is not None:
        raise ConfigurationError(
            "The job's GPUs differ: Perseus runs every copy of a pipeline stage at the same "
            f"clocks, so it needs one GPU type and one set of SM clocks everywhere: {problem}"
        )
