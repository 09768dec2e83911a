"""Frontier directories: ``frontier.csv`` and one plan file per point under ``plans/``.

``frontier.csv`` has the columns `FRONTIER_COLUMNS` (``index,iteration_time,energy,
lower_bound,plan``), one row per point, fastest first; ``plan`` is the point's plan file
relative to the directory (``plans/plan_NNNNN.json``, written by `perseus.io.plan_file`).
``all_max.json`` beside it is the reference plan (every instruction at its maximum clock),
the baseline that slowdowns are measured against: where the top clock is power-capped the
frontier's first points are faster than it. `perseus.planning.Frontier` writes and reads
whole frontiers through this module; `perseus choose` and the plot read only the table
(and the reference's iteration time, `read_reference_time`).
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

from perseus.domain.plan import Plan
from perseus.errors import PlanError
from perseus.io.atomic import atomic_write_text
from perseus.io.plan_file import load_plan, plan_text, save_plan

__all__ = [
    "FRONTIER_COLUMNS",
    "FrontierRow",
    "FrontierTable",
    "REFERENCE_PLAN",
    "read_frontier_dir",
    "read_frontier_table",
    "read_reference_plan",
    "read_reference_time",
    "write_frontier_dir",
]

FRONTIER_COLUMNS = ("index", "iteration_time", "energy", "lower_bound", "plan")
REFERENCE_PLAN = "all_max.json"
"""The reference (all-max) plan's file in a frontier directory."""
_WRITE_AHEAD_CHARS = 32 * 2**20
"""Plan text queued for the writer thread at most (a 16 × 256 plan is ~1 MB, an 8 × 24 one
6 KB: small plans all queue at once, big ones a few dozen)."""


class FrontierRow(NamedTuple):
    """One point to write: its numbers and its plan."""

    iteration_time: float
    energy: float
    lower_bound: float
    plan: Plan


def write_frontier_dir(
    out_dir: str | os.PathLike[str], rows: Iterable[FrontierRow], reference: Plan | None = None
) -> Path:
    """Write ``frontier.csv`` and ``plans/plan_NNNNN.json`` (one plan file per row, old
    plan files removed first), and the `reference` plan as ``all_max.json`` (an old one
    is removed when there is none); returns the path of ``frontier.csv``.

    `rows` may be a generator: a thread of its own creates the files (the system calls let
    go of the GIL) while the next rows' plans are built and serialised.
    """
    out = Path(out_dir)
    plans = out / "plans"
    plans.mkdir(parents=True, exist_ok=True)
    for old in plans.glob("plan_*.json"):
        old.unlink()
    if reference is None:
        (out / REFERENCE_PLAN).unlink(missing_ok=True)
    else:
        save_plan(reference, out / REFERENCE_PLAN)
    table = []
    with ThreadPoolExecutor(1, thread_name_prefix="perseus-write") as writer:
        pending: deque[tuple[Future[None], int]] = deque()
        queued = 0  # characters of plan text waiting for the writer
        for k, row in enumerate(rows):
            rel = f"plans/plan_{k:05d}.json"
            text = plan_text(row.plan)
            while pending and queued + len(text) > _WRITE_AHEAD_CHARS:
                done, size = pending.popleft()
                done.result()
                queued -= size
            pending.append((writer.submit(atomic_write_text, out / rel, text), len(text)))
            queued += len(text)
            table.append(
                (k, repr(row.iteration_time), repr(row.energy), repr(row.lower_bound), rel)
            )
        for done, _ in pending:
            done.result()  # the first failure, if any, raised here
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(FRONTIER_COLUMNS)
    writer.writerows(table)
    atomic_write_text(out / "frontier.csv", buf.getvalue())
    return out / "frontier.csv"


def read_frontier_dir(out_dir: str | os.PathLike[str]) -> list[FrontierRow]:
    """Read a frontier written by `write_frontier_dir`, rows in ``index`` order whatever the
    file's row order (see `read_frontier_table`); plans are validated on load."""
    out = Path(out_dir)
    table = read_frontier_table(out)
    return [
        FrontierRow(t_s, e_j, lb_j, load_plan(out / rel))
        for t_s, e_j, lb_j, rel in zip(
            table.iteration_time, table.energy, table.lower_bound, table.plan, strict=True
        )
    ]


class FrontierTable(NamedTuple):
    """The columns of a ``frontier.csv`` (see `FRONTIER_COLUMNS`), rows in ``index`` order."""

    index: list[int]
    iteration_time: list[float]
    energy: list[float]
    lower_bound: list[float]
    plan: list[str]
    """Plan paths relative to the frontier's directory."""


def read_frontier_table(out_dir: str | os.PathLike[str]) -> FrontierTable:
    """Read and check ``DIR/frontier.csv`` without loading its plans.

    Rows come back sorted by ``index`` (stable), whatever their order in the file, so that
    every reader (`perseus choose`, `read_frontier_dir`, the plot) breaks ties the same way.

    Raises `PlanError` naming the file (and line) when it is missing, not a CSV, lacks a
    column, lists no plans, or has a value that is not a finite number or a plan path.
    """
    path = Path(out_dir) / "frontier.csv"
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.reader(fh)
            header = next(reader, None) or []
            rows = list(reader)
    except OSError as exc:
        raise PlanError(
            f"Cannot read frontier {str(path)!r}: {exc.strerror or exc}; run "
            f"`perseus solve ... --out {out_dir}` first"
        ) from exc
    except (UnicodeDecodeError, csv.Error) as exc:
        raise PlanError(f"{str(path)!r} is not a frontier CSV ({exc})") from None
    missing = [c for c in FRONTIER_COLUMNS if c not in header]
    if missing:
        raise PlanError(
            f"{str(path)!r} lacks column(s) {', '.join(missing)}; expected "
            f"{','.join(FRONTIER_COLUMNS)}"
        )
    if not rows:
        raise PlanError(f"{str(path)!r} lists no plans")
    where = {c: header.index(c) for c in FRONTIER_COLUMNS}
    columns: dict[str, list] = {c: [] for c in FRONTIER_COLUMNS}
    for line, row in enumerate(rows, start=2):
        if len(row) != len(header):
            raise PlanError(
                f"{str(path)!r} line {line} has {len(row)} field(s), the header {len(header)}"
            )
        for column in FRONTIER_COLUMNS[:-1]:
            text = row[where[column]]
            try:
                value = float(text)
            except ValueError:
                value = math.nan
            if not math.isfinite(value) or (column == "index" and value != int(value)):
                kind = "an integer" if column == "index" else "a finite number"
                raise PlanError(f"{str(path)!r} line {line}: {column} must be {kind}, got {text!r}")
            columns[column].append(int(value) if column == "index" else value)
        plan = row[where["plan"]].strip()
        if not plan:
            raise PlanError(f"{str(path)!r} line {line}: no plan path")
        columns["plan"].append(plan)
    order = sorted(range(len(rows)), key=columns["index"].__getitem__)
    return FrontierTable(**{c: [values[k] for k in order] for c, values in columns.items()})


def read_reference_plan(out_dir: str | os.PathLike[str]) -> Plan | None:
    """The reference (all-max) plan of a frontier directory, validated; ``None`` for a
    directory written without one (its first row is then the all-max time)."""
    path = Path(out_dir) / REFERENCE_PLAN
    if not path.exists():
        return None
    plan = load_plan(path)
    if not (math.isfinite(plan.iteration_time) and plan.iteration_time > 0):
        raise PlanError(
            f"{str(path)!r}: iteration_time must be a positive number of seconds, got "
            f"{plan.iteration_time!r}"
        )
    return plan


def read_reference_time(out_dir: str | os.PathLike[str], table: FrontierTable) -> float:
    """The iteration time slowdowns are measured against: the reference plan's, else (a
    directory without ``all_max.json``) the fastest row's."""
    plan = read_reference_plan(out_dir)
    return plan.iteration_time if plan is not None else table.iteration_time[0]
