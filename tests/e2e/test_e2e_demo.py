"""`perseus demo` end to end, shrunk: 2 ranks instead of 4, fewer steps (default schedule: zb).

The command function is mounted on a local typer app here (the `perseus` app mounts the
same function), so this runs exactly what ``perseus demo`` runs.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import typer
from e2e_fixtures import require_torch
from rich.progress import Progress
from typer.testing import CliRunner

from perseus.cli.demo import demo
from perseus.demo import Coordinator, DemoJob
from perseus.demo.run import _run_phase
from perseus.errors import PerseusError
from perseus.io.plan_file import load_plan
from perseus.io.profile_csv import load_profile

require_torch()


def test_demo_reports_the_jobs_own_saving_and_writes_its_artifacts(tmp_path):
    app = typer.Typer()
    app.command()(demo)
    out = tmp_path / "demo"
    result = CliRunner().invoke(
        app, ["--out", str(out), "--layers", "2,6", "--steps", "100", "--freq-step", "20"]
    )
    assert result.exit_code == 0, result.output
    for row in ("all-max", "Perseus plan", "energy saved", "slowdown"):
        assert row in result.output
    for name in ("profile.csv", "frontier.png", "timeline.png", "plan.json", "summary.json"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads((out / "summary.json").read_text())
    # The demo opted in to emulated GPUs, says so, and so does every file it wrote.
    text = " ".join(result.output.split())
    assert "Emulated GPUs: the demo sets ZEUS_GPU_BACKEND=emulated" in text
    assert "(emulated GPUs)" in text
    assert summary["emulated"] is True
    assert json.loads((out / "plan.json").read_text())["emulated"] is True
    header = (out / "profile.csv").read_text().splitlines()[0].split(",")
    assert header[-3:] == ["emulated", "method", "energy_se"]  # a model's numbers, estimated
    assert load_profile(out / "profile.csv").emulated
    measured = summary["measured"]
    assert f"{100 * measured['energy_saved']:.1f} %" in result.output
    plan = load_plan(out / "plan.json")
    # One prediction: the plan file's numbers against the all-max plan scored by the same
    # model (the coordinator's baseline_plan.json), as the summary and the console say.
    (job_dir,) = (out / "Perseus" / "dump").iterdir()
    base = load_plan(job_dir / "baseline_plan.json")
    planned = summary["predicted"]
    assert planned["slowdown"] == pytest.approx(plan.iteration_time / base.iteration_time - 1)
    assert planned["energy_saved"] == pytest.approx(1 - plan.energy / base.energy)
    assert f"{100 * planned['energy_saved']:.1f} % saved at" in text
    assert plan.switch_latency > 0  # the ranks measured their clock switch
    if any(f < 1410 for s in plan.stage_frequencies() for f in s):
        # A plan was deployed and kept: its promise held, measured (tolerances: README).
        assert 0 <= planned["slowdown"] <= 0.01 + 1e-9
        assert measured["slowdown"] <= 0.01 + 0.02
        assert measured["energy_saved"] > 0
    else:  # all-max kept: the summary says why
        assert summary["promise"], summary


def test_demo_rejects_too_few_steps(tmp_path):
    app = typer.Typer()
    app.command()(demo)
    result = CliRunner().invoke(app, ["--out", str(tmp_path), "--steps", "0"])
    assert result.exit_code == 2
    assert "steps must be at least 1" in result.output


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


def test_demo_checks_the_layers_before_starting_anything(tmp_path):
    app = typer.Typer()
    app.command()(demo)
    result = CliRunner().invoke(app, ["--out", str(tmp_path / "d"), "--layers", "1,x"])
    assert result.exit_code == 2
    assert "--layers '1,x' must be comma-separated layer counts" in result.output
    assert not (tmp_path / "d").exists()


def test_a_failed_training_job_is_reported_with_the_ranks_own_errors(tmp_path):
    # A layout the ranks refuse (a stage with no layer): torchrun's failure summary ends the
    # log, so the ranks' one-line errors must be lifted into the message.
    spec = DemoJob(nproc=2, layers="1,0", steps=1)
    coordinator = Coordinator(
        scheduler="AllMaxFrequency",
        scheduler_args={"num_microbatches": spec.microbatches},
        dump_dir=tmp_path / "dump",
        log_path=tmp_path / "coordinator.log",
    )
    with Progress(disable=True) as progress, pytest.raises(PerseusError) as failure:
        _run_phase("Baseline", coordinator, spec, tmp_path / "trace", tmp_path / "t.log", progress)
    head = str(failure.value).split("; its log")[0]
    assert head.startswith("The Baseline training job failed with exit status 1")
    # Whichever rank fails first; torchrun then stops the other.
    assert re.search(r"rank [01]: error: ConfigurationError: --layers '1,0': every stage", head)
