"""`perseus demo` end to end, shrunk: 2 ranks instead of 4, fewer steps.

The command function is mounted on a local typer app here (the `perseus` app mounts the
same function), so this runs exactly what ``perseus demo`` runs.
"""

from __future__ import annotations

import json
import subprocess
import sys

import typer
from e2e_fixtures import require_torch
from typer.testing import CliRunner

from perseus.cli.demo import demo
from perseus.plan import Plan

require_torch()


def test_demo_compares_all_max_and_perseus_and_writes_its_artifacts(tmp_path):
    app = typer.Typer()
    app.command()(demo)
    out = tmp_path / "demo"
    result = CliRunner().invoke(
        app,
        [
            "--out",
            str(out),
            "--layers",
            "1,3",
            "--baseline-steps",
            "6",
            "--perseus-steps",
            "14",
            "--measure-steps",
            "4",
            "--freq-step",
            "20",
        ],
    )
    assert result.exit_code == 0, result.output
    for row in ("AllMaxFrequency", "Perseus", "energy saved", "slowdown"):
        assert row in result.output
    for name in ("profile.csv", "frontier.png", "timeline.png", "plan.json", "summary.json"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["energy_saved"] > 0.0
    assert f"{100 * summary['energy_saved']:.1f} %" in result.output
    plan = Plan.load(out / "plan.json")
    assert plan.num_stages == 2 and any(f < 1410 for s in plan.stage_frequencies() for f in s)


def test_demo_rejects_too_few_steps(tmp_path):
    app = typer.Typer()
    app.command()(demo)
    result = CliRunner().invoke(
        app, ["--out", str(tmp_path), "--baseline-steps", "4", "--measure-steps", "8"]
    )
    assert result.exit_code == 2
    assert "Need more steps than measured ones: baseline_steps=4" in result.output


BLOCK_TORCH = """
import importlib.abc, sys

class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}")

sys.meta_path.insert(0, NoTorch())
from perseus.demo import require_torch
require_torch()
"""


def test_without_torch_the_demo_says_how_to_install_it():
    proc = subprocess.run(
        [sys.executable, "-c", BLOCK_TORCH], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1
    assert "needs PyTorch, which is not installed: pip install 'perseus-energy[torch]'" in (
        proc.stderr
    )
