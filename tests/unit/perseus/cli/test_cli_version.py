"""`perseus --version` prints the installed distribution's version and exits 0."""

from __future__ import annotations

from importlib.metadata import version

from typer.testing import CliRunner

from perseus.cli import app


def test_version_is_the_installed_distributions() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"perseus {version('perseus-energy')}"
