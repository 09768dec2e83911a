"""Plan files: JSON, never code. The only reader and writer of them."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from pydantic import ValidationError

from perseus.domain.plan import Plan
from perseus.errors import PlanError
from perseus.io.atomic import atomic_write_text

__all__ = ["load_plan", "save_plan"]


def load_plan(path: str | os.PathLike[str]) -> Plan:
    """Read and validate a plan file; `PlanError` with the reason on any problem."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise PlanError(f"Cannot read plan file {str(p)!r}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise PlanError(f"Plan file {str(p)!r} is not UTF-8 JSON text ({exc})") from None
    try:
        json.loads(text)
        plan = Plan.model_validate_json(text)
    except json.JSONDecodeError as exc:
        raise PlanError(f"Plan file {str(p)!r} is not valid JSON: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(x) for x in e['loc']) or '<root>'}: {e['msg']}"
            for e in exc.errors()[:5]
        )
        raise PlanError(f"Plan file {str(p)!r} is invalid: {problems}") from None
    if not (math.isfinite(plan.iteration_time) and math.isfinite(plan.energy)):
        raise PlanError(f"Plan file {str(p)!r} has a non-finite iteration_time or energy")
    return plan


def save_plan(plan: Plan, path: str | os.PathLike[str]) -> None:
    """Write the plan as JSON (atomically)."""
    atomic_write_text(Path(path), plan.model_dump_json(indent=None) + "\n")
