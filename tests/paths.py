"""Where the tests find the repository and the published reference data, and whether they
run under CI.

CI mode (`ci_mode`: the ``CI`` variable is ``true``, ``1`` or ``yes``, as CI services set
it and `.ci/run` makes sure of) turns what a developer may skip into failures CI can see:
a run that collects no test (a mistyped ``-k`` or ``-m``), reference data that is
missing (`require_data`) and a dependency that does not import (`require_module`: torch,
which whole tiers need).
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
SHARED_DATA = REPO.parent / "shared" / "data"
"""`../shared/data` beside the checkout: real published profiles, never copied in."""


def ci_mode() -> bool:
    """Whether the suite runs under CI (``CI=true``)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def require_data(path: Path) -> Path:
    """`path`, a reference data file; a missing one skips the test, and fails it under CI."""
    if path.is_file():
        return path
    if ci_mode():
        pytest.fail(
            f"reference data missing under CI: {path} (CI needs ../shared/data beside the "
            "checkout; outside CI this test is skipped)",
            pytrace=False,
        )
    pytest.skip(f"reference data not present at {path}")


def require_module(name: str) -> ModuleType:
    """The module `name` (``pytest.importorskip``'s stand-in): one that does not import
    skips the test (or the whole module, at import time), and fails it under CI, where a
    skipped tier would pass whatever the product does."""
    if ci_mode():
        try:
            return importlib.import_module(name)
        except ImportError as e:
            pytest.fail(
                f"{name} does not import under CI ({e!r}); outside CI the tests that need it "
                "are skipped",
                pytrace=False,
            )
    return pytest.importorskip(name)
