"""Plan files: data, never code. The only reader and writer of them.

A plan file is JSON (`perseus.domain.plan.Plan`: the clocks with the pipeline they are for
and the numbers they were scored at). `read_plan` also takes the Zeus / lowtime style, a
Python literal of the clocks alone, one list per pipeline rank in execution order::

    [[("forward", 1410), ("forward", 1395), ("backward", 1380), ...], ...]

read with `ast.literal_eval` (literals only: no name, call or operator is evaluated), at
most `MAX_PLAN_BYTES`, and validated like the JSON plan's ``frequencies`` (known
instruction kinds, whole positive MHz, at most `MAX_ACTIONS` entries). Such a plan says
neither its pipeline nor its time and energy: `perseus.schedulers.point_solution.PointSolution`
checks it against the job's pipeline; commands that need a scored plan take JSON only.
"""

from __future__ import annotations

import ast
import json
import math
import os
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field, TypeAdapter, ValidationError

from perseus.domain.kinds import INSTRUCTIONS
from perseus.domain.plan import Plan
from perseus.domain.schedule import MAX_ACTIONS
from perseus.errors import PlanError
from perseus.io.atomic import atomic_write_text

__all__ = ["MAX_PLAN_BYTES", "FrequencyLists", "load_plan", "plan_text", "read_plan", "save_plan"]

MAX_PLAN_BYTES = 64 * 1024 * 1024
"""The largest plan file read (a 16 × 256 plan is about 1 MB)."""

FrequencyLists = list[list[tuple[str, int]]]
"""Per pipeline rank, its (instruction kind, SM MHz) in execution order."""


def _known_kind(kind: str) -> str:
    if kind not in INSTRUCTIONS:
        raise ValueError(f"{kind!r} is not an instruction kind ({', '.join(INSTRUCTIONS)})")
    return kind


_Kind = Annotated[str, Field(strict=True, max_length=32), AfterValidator(_known_kind)]
_MHz = Annotated[int, Field(strict=True, gt=0, le=100_000)]
_LITERAL = TypeAdapter(
    Annotated[
        list[Annotated[list[tuple[_Kind, _MHz]], Field(max_length=MAX_ACTIONS)]],
        Field(min_length=1, max_length=65_536),
    ]
)


def _read_text(p: Path) -> str:
    try:
        size = p.stat().st_size
        if size > MAX_PLAN_BYTES:
            raise PlanError(
                f"Plan file {str(p)!r} has {size:,} bytes; at most {MAX_PLAN_BYTES:,} are read"
            )
        return p.read_text(encoding="utf-8")
    except OSError as exc:
        raise PlanError(f"Cannot read plan file {str(p)!r}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise PlanError(f"Plan file {str(p)!r} is not UTF-8 JSON text ({exc})") from None


def _problems(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(x) for x in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors()[:5]
    )


def _json_plan(text: str, where: str) -> Plan:
    try:
        plan = Plan.model_validate_json(text)
    except ValidationError as exc:
        raise PlanError(f"Plan file {where} is invalid: {_problems(exc)}") from None
    if not (math.isfinite(plan.iteration_time) and math.isfinite(plan.energy)):
        raise PlanError(f"Plan file {where} has a non-finite iteration_time or energy")
    return plan


def _literal_plan(text: str, where: str) -> FrequencyLists:
    try:
        value = ast.literal_eval(text)
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError) as exc:
        raise PlanError(
            f"Plan file {where} is not valid JSON, nor a Python literal "
            f"({type(exc).__name__}: {str(exc)[:200]})"
        ) from None
    try:
        lists = _LITERAL.validate_python(value)
    except ValidationError as exc:
        raise PlanError(
            f"Plan file {where} (a Python literal) is not a list of per-rank "
            f"[(kind, MHz), ...] lists: {_problems(exc)}"
        ) from None
    total = sum(len(entries) for entries in lists)
    if total > MAX_ACTIONS:
        raise PlanError(f"Plan file {where} lists {total:,} instructions; at most {MAX_ACTIONS:,}")
    return [[(str(kind), int(mhz)) for kind, mhz in entries] for entries in lists]


def read_plan(path: str | os.PathLike[str]) -> Plan | FrequencyLists:
    """Read and validate a plan file: a JSON `Plan`, or a Python literal's `FrequencyLists`;
    `PlanError` with the reason on any problem."""
    p = Path(path)
    where = repr(str(p))
    text = _read_text(p)
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return _literal_plan(text, where)
    except RecursionError:
        raise PlanError(f"Plan file {where} nests too deeply") from None
    return _json_plan(text, where)


def load_plan(path: str | os.PathLike[str]) -> Plan:
    """Read and validate a JSON plan file; `PlanError` with the reason on any problem."""
    p = Path(path)
    where = repr(str(p))
    text = _read_text(p)
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        hint = ""
        if text.lstrip().startswith(("[", "(")):
            hint = (
                " (a Zeus-style Python literal of clocks says neither its pipeline nor its "
                "time and energy: only the PointSolution scheduler deploys one)"
            )
        raise PlanError(f"Plan file {where} is not valid JSON: {exc}{hint}") from None
    except RecursionError:
        raise PlanError(f"Plan file {where} nests too deeply") from None
    return _json_plan(text, where)


def plan_text(plan: Plan) -> str:
    """The plan file's text: one line of JSON."""
    return plan.model_dump_json(indent=None) + "\n"


def save_plan(plan: Plan, path: str | os.PathLike[str]) -> None:
    """Write the plan as JSON (atomically)."""
    atomic_write_text(Path(path), plan_text(plan))
