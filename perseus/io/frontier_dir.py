"""Frontier directories: ``frontier.csv`` and one plan file per point under ``plans/``.

``frontier.csv`` has the columns `FRONTIER_COLUMNS` (``index,iteration_time,energy,
lower_bound,plan``), one row per point, fastest first; ``plan`` is the point's plan file
relative to the directory (``plans/plan_NNNNN.json``, written by `perseus.io.plan_file`).
``all_max.json`` beside it is the reference plan (every instruction at its maximum clock),
the baseline that slowdowns are measured against: where the top clock is power-capped the
frontier's first points are faster than it. `perseus.planning.Frontier` writes and reads
whole frontiers through this module; `perseus choose` and the plot read only the table
(and the reference's iteration time, `read_reference_time`).

A *compact* directory (`write_compact_frontier_dir`; what the coordinator keeps for every
job) holds the same ``frontier.csv`` and ``all_max.json`` but no plan files: every point's
clocks are one row of ``plans.npz`` (`COMPACT_PLANS`), since a plan file per point costs
~0.5 GB at 16 stages × 256 microbatches and the clocks alone compress to a few MB. The
table's ``plan`` column still names ``plans/plan_NNNNN.json``; `frontier_plan_file` writes
that file from ``plans.npz`` when it is asked for (`perseus choose`), and
`read_frontier_dir` builds the plans from it. Where ``plans.npz`` exists it is the truth:
both writers remove what the other layout left.
"""

from __future__ import annotations

import csv
import io
import math
import os
import tempfile
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np

from perseus.domain.plan import Evaluation, Plan
from perseus.domain.schedule import PipelineSchedule
from perseus.errors import PlanError
from perseus.io.atomic import atomic_write_text
from perseus.io.plan_file import load_plan, plan_text, save_plan

__all__ = [
    "COMPACT_PLANS",
    "FRONTIER_COLUMNS",
    "CompactPlans",
    "FrontierRow",
    "FrontierTable",
    "REFERENCE_PLAN",
    "frontier_plan_file",
    "read_compact_plans",
    "read_frontier_dir",
    "read_frontier_table",
    "read_reference_plan",
    "read_reference_time",
    "write_compact_frontier_dir",
    "write_frontier_dir",
]

FRONTIER_COLUMNS = ("index", "iteration_time", "energy", "lower_bound", "plan")
REFERENCE_PLAN = "all_max.json"
"""The reference (all-max) plan's file in a frontier directory."""
COMPACT_PLANS = "plans.npz"
"""A compact frontier directory's clocks (see the module docstring and `CompactPlans`)."""
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
    (out / COMPACT_PLANS).unlink(missing_ok=True)  # it would win over the plan files
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
    compact = read_compact_plans(out, table)
    if compact is not None:
        reference = _compact_reference(out)
        schedule = reference.pipeline_schedule()
        plans = [compact.plan(reference, table, k, schedule) for k in range(len(table.index))]
    else:
        plans = [load_plan(out / rel) for rel in table.plan]
    return [
        FrontierRow(t_s, e_j, lb_j, plan)
        for t_s, e_j, lb_j, plan in zip(
            table.iteration_time, table.energy, table.lower_bound, plans, strict=True
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
    column, lists no plans, or has a value that is not a finite number or a plan path (a
    ``lower_bound`` may be ``nan``: unknown).
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
            # A lower bound may be unknown (plans the LP did not bound: per-stage ones).
            unknown = column == "lower_bound" and text.strip().lower() == "nan"
            if not unknown and (
                not math.isfinite(value) or (column == "index" and value != int(value))
            ):
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


# ---------------------------------------------------------------------- the compact layout
class CompactPlans(NamedTuple):
    """The clocks of a compact frontier directory (``plans.npz``), one row per point.

    Row ``i`` is the point whose ``index`` is ``i`` in ``frontier.csv``; its columns are the
    clocks (MHz) of every instruction, stage after stage, each stage in execution order
    (the plan-file layout), `stage_sizes` long each.
    """

    frequencies: np.ndarray
    """(points, instructions) clocks, MHz (uint16)."""
    compute_energy: np.ndarray
    """(points,) the compute part of each point's energy, J (NaN: unknown)."""
    stage_sizes: tuple[int, ...]

    def stage_frequencies(self, row: int) -> list[np.ndarray]:
        """Row `row`'s clocks split per stage."""
        bounds = np.cumsum(self.stage_sizes)[:-1]
        return np.split(self.frequencies[row].astype(np.int32), bounds)

    def plan(
        self,
        reference: Plan,
        table: FrontierTable,
        k: int,
        schedule: PipelineSchedule | None = None,
    ) -> Plan:
        """The plan of the table's `k`-th row (in index order), scored as the table says and
        with the reference plan's pipeline (`schedule`, built from it when not given),
        blocking power and latencies."""
        row = table.index[k]
        compute = float(self.compute_energy[row])
        energy = table.energy[k]
        evaluation = Evaluation(
            iteration_time_s=table.iteration_time[k],
            energy_j=energy,
            compute_energy_j=compute,
            blocking_energy_j=energy - compute,
        )
        return Plan.from_frequencies(
            schedule if schedule is not None else reference.pipeline_schedule(),
            [f.tolist() for f in self.stage_frequencies(row)],
            p2p_power_w=reference.p2p_power,
            evaluation=evaluation,
            emulated=reference.emulated,
            switch_latency_s=reference.switch_latency,
            hop_latency_s=reference.hop_latency,
        )


def write_compact_frontier_dir(
    out_dir: str | os.PathLike[str],
    iteration_time: Iterable[float],
    energy: Iterable[float],
    lower_bound: Iterable[float],
    plans: CompactPlans,
    reference: Plan,
) -> Path:
    """Write a compact frontier directory (module docstring): ``frontier.csv`` (one row per
    row of `plans`, in that order), ``plans.npz`` and the `reference` plan as
    ``all_max.json``, which every point's plan takes its pipeline and costs from. Plan files
    an earlier frontier left in ``plans/`` are removed. Each file is written atomically; for
    a whole directory that readers never see half of, write a new one and `replace_dir` it.
    Returns the path of ``frontier.csv``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    freqs = np.asarray(plans.frequencies)
    if freqs.ndim != 2 or freqs.shape[1] != sum(plans.stage_sizes):
        raise PlanError(
            f"Compact plans need one row of {sum(plans.stage_sizes)} clocks per point, got an "
            f"array of shape {freqs.shape}"
        )
    if freqs.size and (freqs.min() <= 0 or freqs.max() > np.iinfo(np.uint16).max):
        raise PlanError("Compact plans hold clocks of 1 to 65,535 MHz")
    table = [
        (k, repr(float(t)), repr(float(e)), repr(float(lb)), f"plans/plan_{k:05d}.json")
        for k, (t, e, lb) in enumerate(zip(iteration_time, energy, lower_bound, strict=True))
    ]
    if len(table) != freqs.shape[0] or len(plans.compute_energy) != freqs.shape[0]:
        raise PlanError(
            f"Compact plans: {len(table)} row(s) of figures for {freqs.shape[0]} point(s)"
        )
    save_plan(reference, out / REFERENCE_PLAN)
    fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{COMPACT_PLANS}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez_compressed(
                f,
                frequencies=freqs.astype(np.uint16),
                compute_energy=np.asarray(plans.compute_energy, dtype=np.float64),
                stage_sizes=np.asarray(plans.stage_sizes, dtype=np.int64),
            )
        os.replace(tmp, out / COMPACT_PLANS)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    for old in (out / "plans").glob("plan_*.json"):
        old.unlink()
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(FRONTIER_COLUMNS)
    writer.writerows(table)
    atomic_write_text(out / "frontier.csv", buf.getvalue())
    return out / "frontier.csv"


def read_compact_plans(
    out_dir: str | os.PathLike[str], table: FrontierTable | None = None
) -> CompactPlans | None:
    """The clocks of a compact frontier directory, checked against its `table` (read when
    not given) and its reference plan; None for a directory of plan files.

    Raises `PlanError` naming the file when it is not such an archive (it is data: no
    pickled object is ever loaded) or does not match the table or the reference plan.
    """
    out = Path(out_dir)
    path = out / COMPACT_PLANS
    if not path.exists():
        return None
    if table is None:
        table = read_frontier_table(out)
    try:
        with np.load(path, allow_pickle=False) as data:
            freqs = np.asarray(data["frequencies"])
            compute = np.asarray(data["compute_energy"], dtype=np.float64)
            sizes = tuple(int(n) for n in data["stage_sizes"])
    except (OSError, ValueError, KeyError, EOFError) as exc:
        raise PlanError(f"{str(path)!r} is not a frontier's clock archive ({exc})") from None
    where = f"{str(path)!r}"
    if freqs.ndim != 2 or freqs.shape[1] != sum(sizes) or compute.shape != (freqs.shape[0],):
        raise PlanError(f"{where}: clocks of shape {freqs.shape} for stages of {sizes}")
    if not np.issubdtype(freqs.dtype, np.integer) or (freqs.size and freqs.min() <= 0):
        raise PlanError(f"{where}: clocks must be positive whole MHz")
    if min(table.index) < 0 or max(table.index) >= freqs.shape[0]:
        raise PlanError(
            f"{where} holds {freqs.shape[0]} point(s); frontier.csv indexes "
            f"{min(table.index)}..{max(table.index)}"
        )
    reference = _compact_reference(out)
    if tuple(len(stage) for stage in reference.frequencies) != sizes:
        raise PlanError(f"{where}: its stages ({sizes}) are not those of {REFERENCE_PLAN}")
    return CompactPlans(freqs, compute, sizes)


def _compact_reference(out: Path) -> Plan:
    reference = read_reference_plan(out)
    if reference is None:
        raise PlanError(
            f"{str(out / COMPACT_PLANS)!r} needs {REFERENCE_PLAN} beside it (the pipeline and "
            "costs of its plans)"
        )
    return reference


def frontier_plan_file(out_dir: str | os.PathLike[str], table: FrontierTable, k: int) -> Path:
    """The plan file of the table's `k`-th row (in index order); in a compact directory it
    is written from ``plans.npz`` when it is not there yet (`perseus choose` prints it)."""
    out = Path(out_dir)
    path = out / table.plan[k]
    compact = read_compact_plans(out, table)
    if compact is not None and not path.exists():
        save_plan(compact.plan(_compact_reference(out), table, k), path)
    return path
