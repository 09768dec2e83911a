"""The project as a Python user gets it: build, check, install in a fresh venv, run.

`python -m build` makes the sdist and the wheel from a copy of the checkout's files (the
wheel from the sdist, so the sdist must carry everything); `twine check --strict` passes;
the wheel installs into a fresh virtual environment (no system site-packages, nothing of
this checkout on its path) and `perseus --version` and `perseus solve bloom_a40_8stage` run
there from an empty directory, reading the profile shipped inside the wheel.

The `torch` extra declares a range, not the CPU build CI pins: installing it beside a torch
that is already there and in range keeps that torch. A real second torch is gigabytes, so
the venv gets a metadata-only stand-in distribution named ``torch`` at 2.9.0 (pip decides
from the installed version alone); with ``-c constraints/cpu-torch.txt`` pip would instead
move it to the pinned 2.13.0, which is what the README's commands are for.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from paths import REPO

TIMEOUT_S = 600


def _run(cmd: list[str], *, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    assert done.returncode == 0, f"$ {' '.join(cmd)}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sdist and wheel built from the checkout's files (tracked, or new and not ignored)."""
    tmp = tmp_path_factory.mktemp("build")
    src = tmp / "src"
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    out = tmp / "dist"
    _run([sys.executable, "-m", "build", "--outdir", str(out), str(src)])
    return out


@pytest.fixture(scope="module")
def venv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with the built wheel installed."""
    venv = tmp_path_factory.mktemp("venv") / "v"
    _run([sys.executable, "-m", "venv", str(venv)])
    [wheel] = dist.glob("*.whl")
    # --no-compile: byte-compiling scipy, pandas and matplotlib would double the install time.
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile", str(wheel)])
    return venv


def test_build_makes_an_sdist_and_a_wheel_that_twine_passes(dist: Path) -> None:
    files = sorted(p.name for p in dist.iterdir())
    assert [f for f in files if f.endswith(".whl")] == ["perseus_energy-0.1.0-py3-none-any.whl"]
    assert [f for f in files if f.endswith(".tar.gz")] == ["perseus_energy-0.1.0.tar.gz"]
    done = _run([sys.executable, "-m", "twine", "check", "--strict", *map(str, dist.iterdir())])
    assert done.stdout.count("PASSED") == 2, done.stdout


def test_the_wheel_carries_profiles_types_and_license(dist: Path) -> None:
    [wheel] = dist.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {p.name for p in (REPO / "perseus" / "profiles").glob("*.csv")}
    assert shipped and {f"perseus/profiles/{n}" for n in shipped} <= names
    assert {"perseus/py.typed", "zeus_power/py.typed"} <= names
    assert "perseus_energy-0.1.0.dist-info/licenses/LICENSE" in names
    metadata = zipfile.ZipFile(wheel).read("perseus_energy-0.1.0.dist-info/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata
    assert 'Requires-Dist: torch<3,>=2.8; extra == "torch"' in metadata
    assert not any(n.startswith(("tests/", "benchmarks/")) for n in names)
    # Issue 50: only the two roots land in site-packages (no generic `schedulers`, `profiles`).
    top_level = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top_level == {"perseus", "zeus_power"}, top_level


def test_the_installed_wheel_runs_version_and_solve(venv: Path, tmp_path: Path) -> None:
    perseus = str(venv / "bin" / "perseus")
    assert _run([perseus, "--version"], cwd=tmp_path).stdout.strip() == "perseus 0.1.0"
    out = tmp_path / "bloom"
    done = _run([perseus, "solve", "bloom_a40_8stage", "-m", "8", "--out", str(out)], cwd=tmp_path)
    assert "no slowdown" in done.stdout.lower(), done.stdout
    with open(out / "frontier.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) > 10 and all((out / row["plan"]).is_file() for row in rows[:3])
    # The profile came from the installed wheel, not from this checkout.
    where = _run(
        [str(venv / "bin" / "python"), "-c", "import perseus.profiles as p; print(p.__file__)"],
        cwd=tmp_path,
    ).stdout
    assert str(venv) in where


def _stand_in_torch(directory: Path, version: str) -> Path:
    """A wheel of a distribution named torch at `version` with no code: what pip resolves by."""
    dist_info = f"torch-{version}.dist-info"
    files = {
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{name},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = "\n".join(record) + "\n"
    path = directory / f"torch-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


def test_the_torch_extra_keeps_an_installed_torch_in_range(
    venv: Path, dist: Path, tmp_path: Path
) -> None:
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    _run([*pip, "install", "-q", "--no-deps", str(_stand_in_torch(tmp_path, "2.9.0"))])
    [wheel] = dist.glob("*.whl")
    extra = f"perseus-energy[torch] @ {wheel.as_uri()}"

    report = tmp_path / "report.json"
    _run([*pip, "install", "--dry-run", "--quiet", "--report", str(report), extra])
    planned = {
        i["metadata"]["name"]: i["metadata"]["version"]
        for i in json.loads(report.read_text())["install"]
    }
    assert "torch" not in planned, planned

    _run([*pip, "install", "-q", extra])
    shown = _run([*pip, "show", "torch"]).stdout
    assert "Version: 2.9.0" in shown

    # The pin is the constraints file's doing: with it, pip would move torch to 2.13.0.
    constraints = REPO / "constraints" / "cpu-torch.txt"
    _run(
        [
            *pip,
            "install",
            "--dry-run",
            "--quiet",
            "--report",
            str(report),
            "-c",
            str(constraints),
            extra,
        ]
    )
    planned = {
        i["metadata"]["name"]: i["metadata"]["version"]
        for i in json.loads(report.read_text())["install"]
    }
    assert planned.get("torch", "").startswith("2.13.0"), planned
