"""CI mode (``CI=true``): a run that collects no test fails, and missing reference data
or a dependency that does not import (torch) fails the tests that need it; outside CI all
three stay quiet for the quick loop.

The no-test runs are real pytest runs of this suite in a subprocess (``-k`` matching
nothing), so they check the exit status CI sees.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from paths import REPO, SHARED_DATA, TESTS, ci_mode, require_data, require_module


def _pytest_exit(
    ci: str | None, *args: str, cwd: os.PathLike[str] | str = REPO
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # the conftest decides; plugins cost seconds
    if ci is not None:
        env["CI"] = ci
    # xdist loaded by name (the configured ``-n 2`` needs it), run in the pytest process.
    xdist = ["-p", "xdist.plugin", "-n", "0"]
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *xdist, *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_run_that_collects_no_test_fails_under_ci_and_passes_locally():
    here = "tests/unit/test_suite_ci_mode.py"
    under_ci = _pytest_exit("true", here, "-k", "no_such_test")
    assert under_ci.returncode == pytest.ExitCode.NO_TESTS_COLLECTED, under_ci.stdout
    assert "CI=true: a run that collects no test fails" in under_ci.stdout
    local = _pytest_exit(None, here, "-m", "no_such_marker")
    assert local.returncode == 0, local.stdout
    assert "exit 0 outside CI" in local.stdout


@pytest.mark.parametrize(("value", "ci"), [("true", True), ("1", True), ("TRUE", True),
                                           ("false", False), ("", False), (None, False)])  # fmt: skip
def test_ci_mode_reads_the_ci_variable(monkeypatch, value, ci):
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    assert ci_mode() is ci


def test_missing_reference_data_fails_under_ci_and_skips_locally(monkeypatch, tmp_path):
    absent = tmp_path / "sosp24_absent.csv"
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"reference data missing under CI: .*absent"):
        require_data(absent)
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="reference data not present"):
        require_data(absent)


def test_present_reference_data_is_returned_in_both_modes(monkeypatch):
    present = next(iter(sorted(SHARED_DATA.glob("*.csv"))), None)
    if present is None:
        require_data(SHARED_DATA / "sosp24_gpt3-175b_a40_8stage.csv")  # skips, or fails in CI
    for value in ("true", ""):
        monkeypatch.setenv("CI", value)
        assert require_data(present) == present


def test_a_module_that_does_not_import_fails_under_ci_and_skips_locally(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"no_such_module does not import under CI"):
        require_module("no_such_module")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="no_such_module"):
        require_module("no_such_module")
    for value in ("true", ""):
        monkeypatch.setenv("CI", value)
        assert require_module("json") is json


BLOCKED_TORCH = """
import importlib.abc, sys

class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}")

sys.meta_path.insert(0, NoTorch())
"""


def test_a_tier_whose_torch_does_not_import_fails_under_ci(tmp_path):
    """A real pytest run of a module that needs torch, in a Python where torch does not
    import (as on a CI image that lost it): the whole module errors under CI, and is
    skipped outside it."""
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n{BLOCKED_TORCH}"
    )
    (tmp_path / "test_needs_torch.py").write_text(
        'from paths import require_module\n\ntorch = require_module("torch")\n\n\n'
        "def test_uses_torch():\n    assert torch.ones(1).item() == 1\n"
    )
    under_ci = _pytest_exit("true", "-rs", "test_needs_torch.py", cwd=tmp_path)
    assert under_ci.returncode == pytest.ExitCode.INTERRUPTED, under_ci.stdout
    assert "torch does not import under CI" in under_ci.stdout
    local = _pytest_exit(None, "-rs", "test_needs_torch.py", cwd=tmp_path)
    # The module skipped at collection: pytest's "no test collected" (this bare run has no
    # suite conftest to turn it into a pass), not a failure.
    assert local.returncode == pytest.ExitCode.NO_TESTS_COLLECTED, local.stdout
    assert "1 skipped" in local.stdout
