"""The virtual environment Zeus 0.16's own clients run in, for the integration tests.

``zeus[pfo,bso]==0.16.0`` pins pydantic 1, which cannot live beside this project (pydantic 2),
so Zeus gets a virtual environment of its own, created on first use and reused: under
``$XDG_CACHE_HOME/perseus-tests`` (default ``~/.cache/perseus-tests``), in a folder named
after a hash of the requirement set and the Python version, so a changed requirement makes a
new one. Creation takes about 40 s on a fresh machine (pip downloads Zeus's dependencies from
PyPI; torch is the 2.13.0 CPU wheel the machine has on disk) and happens under a file lock, so
concurrent test runs share it. A folder without its ``.ready`` marker (an interrupted
creation) is rebuilt.

When the environment cannot be created (no network, say), the tests that need it FAIL with
pip's own words: a missing peer must never pass as a skipped test.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REQUIREMENTS = ("zeus[pfo,bso]==0.16.0", "aiofiles", "torch==2.13.0")
"""Zeus 0.16 with its pipeline-frequency and batch-size clients; aiofiles and torch, which its
pipeline-frequency client imports but does not declare for the client side."""

ASSETS = Path(__file__).resolve().parent / "zeus_assets" / "zeus016"
"""The scripts run inside the environment (they import Zeus, never this project)."""

CREATE_TIMEOUT_S = 900


def _root() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "perseus-tests"


def venv_dir() -> Path:
    """Where the environment for this requirement set and Python lives."""
    key = json.dumps([list(REQUIREMENTS), sys.version_info[:2]])
    return _root() / f"zeus016-venv-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def _create(venv: Path) -> float:
    start = time.monotonic()
    shutil.rmtree(venv, ignore_errors=True)
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            *REQUIREMENTS,
        ],
        [
            str(venv / "bin" / "python"),
            "-c",
            "import pydantic, zeus.optimizer.batch_size.client, "
            "zeus.optimizer.pipeline_frequency.optimizer; "
            "assert pydantic.VERSION.startswith('1.'), pydantic.VERSION",
        ],
    ]
    for cmd in steps:
        try:
            done = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                timeout=CREATE_TIMEOUT_S,
                env=zeus_env(),
                check=False,
            )
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"Creating the Zeus 0.16 virtual environment at {venv} timed out after "
                f"{CREATE_TIMEOUT_S} s at: {' '.join(cmd)}",
                pytrace=False,
            )
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip()[-3000:]
            pytest.fail(
                f"Cannot create the Zeus 0.16 virtual environment at {venv} (it needs PyPI to "
                f"install {', '.join(REQUIREMENTS)}).\n$ {' '.join(cmd)}\n{tail}",
                pytrace=False,
            )
    return time.monotonic() - start


def zeus016_python() -> Path:
    """The environment's interpreter, creating the environment first if needed."""
    venv = venv_dir()
    python = venv / "bin" / "python"
    ready = venv / ".ready"
    if ready.is_file():
        return python
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not ready.is_file():
            seconds = _create(venv)
            ready.write_text(json.dumps({"requirements": REQUIREMENTS, "created_in_s": seconds}))
    return python


def zeus_env(**extra: str) -> dict[str, str]:
    """The environment of a process in the Zeus venv: this project off its path, the assets
    on it."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(ASSETS)
    env.update(extra)
    return env
