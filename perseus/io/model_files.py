"""Lists of pydantic models as JSON files (a job's dumped rounds and ranks), written
atomically: the format of a ``RootModel[list[Model]]``, one JSON array."""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter

from perseus.io.atomic import atomic_write_text

__all__ = ["dump_models", "load_models"]

M = TypeVar("M", bound=BaseModel)


def dump_models(path: str | os.PathLike[str], items: Sequence[BaseModel]) -> None:
    """Write `items` to `path` as one JSON array (atomically)."""
    atomic_write_text(path, "[" + ",".join(item.model_dump_json() for item in items) + "]")


@cache
def _adapter(model: type[BaseModel]) -> TypeAdapter[Any]:
    return TypeAdapter(list[model])  # type: ignore[valid-type]


def load_models(path: str | os.PathLike[str], model: type[M]) -> list[M]:
    """Read the JSON array of `model`s at `path`, validating each one."""
    return _adapter(model).validate_json(Path(path).read_text())  # type: ignore[no-any-return]
