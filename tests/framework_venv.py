"""Virtual environments for the framework integration tests (issue 51), one per library.

Each holds one pinned library (`FRAMEWORKS`: ``deepspeed==0.19.8``, ``megatron-core==0.16.1``,
``torchtitan==0.2.2``) on top of this environment (``--system-site-packages``: the CPU torch
and this project, installed editable, are shared), under ``$XDG_CACHE_HOME/perseus-tests`` in
a folder named after a hash of the requirements and the Python version: created on first use (under a file lock), reused
after. When it cannot be created the test FAILS with pip's words, never skips.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

FRAMEWORKS: dict[str, tuple[str, ...]] = {
    "deepspeed": ("deepspeed==0.19.8",),
    "megatron": ("megatron-core==0.16.1",),
    # torchtitan imports triton at import time (its MoE kernels), CPU or not.
    "torchtitan": ("torchtitan==0.2.2", "triton==3.9.0"),
}
CREATE_TIMEOUT_S = 900


def venv_dir(name: str) -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    key = json.dumps([FRAMEWORKS[name], sys.version_info[:2]])
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return Path(cache) / "perseus-tests" / f"{name}-venv-{digest}"


def framework_python(name: str) -> Path:
    """The interpreter of `name`'s environment, created first if needed."""
    venv = venv_dir(name)
    python, ready = venv / "bin" / "python", venv / ".ready"
    if ready.is_file():
        return python
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not ready.is_file():
            start = time.monotonic()
            for cmd in (
                [sys.executable, "-m", "venv", "--clear", "--system-site-packages", str(venv)],
                [
                    str(python),
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    *FRAMEWORKS[name],
                ],
            ):
                done = subprocess.run(
                    cmd, capture_output=True, text=True, timeout=CREATE_TIMEOUT_S, check=False
                )
                if done.returncode != 0:
                    pytest.fail(
                        f"Cannot create the {name} environment at {venv}:\n$ {' '.join(cmd)}\n"
                        f"{(done.stderr or done.stdout).strip()[-3000:]}",
                        pytrace=False,
                    )
            ready.write_text(
                json.dumps(
                    {"requirements": FRAMEWORKS[name], "created_in_s": time.monotonic() - start}
                )
            )
    return python
