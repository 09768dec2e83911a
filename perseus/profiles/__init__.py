"""Instruction profiles shipped with Perseus (CSV files made by `perseus profile synth`).

See `README.md` in this folder for how each one was made.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

__all__ = ["available", "path"]


def available() -> list[str]:
    """Names (file stems) of the shipped profiles."""
    return sorted(
        p.name.removesuffix(".csv") for p in files(__name__).iterdir() if p.name.endswith(".csv")
    )


def path(name: str) -> Path:
    """Path of a shipped profile by name (with or without `.csv`)."""
    stem = name.removesuffix(".csv")
    candidate = Path(str(files(__name__).joinpath(f"{stem}.csv")))
    if not candidate.is_file():
        raise FileNotFoundError(
            f"No shipped profile named {name!r}; available: {', '.join(available()) or 'none'}"
        )
    return candidate
