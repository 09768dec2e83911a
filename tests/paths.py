"""Where the tests find the repository and the published reference data."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
SHARED_DATA = REPO.parent / "shared" / "data"
"""`../shared/data` beside the checkout: real published profiles, never copied in."""
