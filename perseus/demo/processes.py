"""The demo's processes: a coordinator subprocess and `torchrun` training jobs."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from perseus.errors import ConfigurationError, PerseusError

__all__ = [
    "Coordinator",
    "DemoJob",
    "TORCH_INSTALL_HINT",
    "free_port",
    "log_tail",
    "rank_errors",
    "require_torch",
    "run_training",
    "torchrun_command",
]

TORCH_INSTALL_HINT = (
    "pip install 'perseus-energy[torch]' (or: pip install torch==2.13.0 --index-url "
    "https://download.pytorch.org/whl/cpu)"
)


def require_torch() -> None:
    """Raise a `ConfigurationError` with install instructions when PyTorch is missing."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise ConfigurationError(
            f"The Perseus training job needs PyTorch, which is not installed: {TORCH_INSTALL_HINT}"
        )


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def rank_errors(path: Path) -> str:
    """The one-line errors the ranks of a failed job printed (``perseus.train rank R: error:
    ...``), which torchrun's failure summary at the end of the log pushes out of view."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    errors = list(dict.fromkeys(line for line in lines if ": error: " in line))[:4]
    return "".join(f"\n  {line}" for line in errors)


class Coordinator:
    """A Perseus coordinator subprocess on a free loopback port (a context manager).

    Args:
        scheduler: Scheduler name (``PERSEUS_SCHEDULER``).
        scheduler_args: ``PERSEUS_SCHEDULER_ARGS``.
        dump_dir: The coordinator's dump directory (profiles, frontiers land here).
        log_path: Where the server's stdout/stderr go.
        round_timeout_s: How long a round's barrier waits for every rank.
        env: Extra environment variables for the server process (with ``PERSEUS_TOKEN``,
            the start-up probe sends it).
        startup_timeout_s: How long to wait for ``GET /info`` to answer.
        serve_args: More ``perseus serve`` options (e.g. ``--max-slowdown 0.01``).
    """

    def __init__(
        self,
        *,
        scheduler: str,
        scheduler_args: Mapping[str, Any] | None = None,
        dump_dir: str | os.PathLike[str],
        log_path: str | os.PathLike[str],
        round_timeout_s: float = 60.0,
        env: Mapping[str, str] | None = None,
        startup_timeout_s: float = 60.0,
        serve_args: Sequence[str] = (),
    ) -> None:
        self.scheduler = scheduler
        self.scheduler_args = dict(scheduler_args or {})
        self.dump_dir = Path(dump_dir)
        self.log_path = Path(log_path)
        self.round_timeout_s = round_timeout_s
        self.extra_env = dict(env or {})
        self.startup_timeout_s = startup_timeout_s
        self.serve_args = list(serve_args)
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Coordinator:
        """Start the server; a restart (after `stop` or `kill`) reuses the same port."""
        self.port = self.port or free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PERSEUS_", "ZEUS_"))}
        env.update(
            {
                "PERSEUS_SCHEDULER": self.scheduler,
                "PERSEUS_SCHEDULER_ARGS": json.dumps(self.scheduler_args),
                "PERSEUS_DUMP_DIR": str(self.dump_dir),
                "PERSEUS_LOG_LEVEL": "warning",
                **self.extra_env,
            }
        )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.dump_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "perseus",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--round-timeout",
            str(self.round_timeout_s),
            *self.serve_args,
        ]
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            if self._proc.poll() is not None:
                raise PerseusError(
                    f"The coordinator ({self.scheduler}) exited with status "
                    f"{self._proc.returncode} while starting; its log ({self.log_path}):\n"
                    f"{log_tail(self.log_path)}"
                )
            token = self.extra_env.get("PERSEUS_TOKEN")
            auth = {"authorization": f"Bearer {token}"} if token else {}
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/info", timeout=2.0, headers=auth).status_code == 200:
                    return self
            if time.monotonic() > deadline:
                self.stop()
                raise PerseusError(
                    f"The coordinator did not answer at {self.url} within "
                    f"{self.startup_timeout_s:g} s; its log ({self.log_path}):\n{log_tail(self.log_path)}"
                )
            time.sleep(0.2)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def kill(self) -> None:
        """SIGKILL the server (no shutdown, nothing flushed): a crashed coordinator."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def job_dirs(self) -> list[Path]:
        """The per-job directories the coordinator created under its dump dir."""
        return sorted(p for p in self.dump_dir.iterdir() if p.is_dir())

    def __enter__(self) -> Coordinator:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@dataclass(frozen=True, kw_only=True)
class DemoJob:
    """A `perseus.train` job: layout, schedule, model size and emulation mode.

    `schedule`, `chunks`, `loop`: ``--schedule``, ``--chunks``, ``--loop`` of
    `perseus.train` (``torch.distributed.pipelining`` by default; ``loop="manual"``: the
    hand-written 1F1B loop).

    `nominal`: emulate nominal instruction times (``PERSEUS_EMULATE_NOMINAL``), each
    layer's forward taking `nominal_ms_per_layer` at the max clock (backward: twice that);
    otherwise the measured CPU time is stretched.
    """

    nproc: int = 4
    layers: str = "2,4,3,1"
    schedule: str = "1f1b"
    chunks: int | None = None
    loop: str = "torch"
    microbatches: int = 4
    steps: int = 10
    hidden: int = 64
    seq_len: int = 32
    microbatch_size: int = 2
    nominal: bool = True
    nominal_ms_per_layer: float = 4.0
    stretch: bool = True
    round_timeout_s: float = 90.0
    pg_timeout_s: float = 60.0
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)

    def train_args(self, server_url: str | None) -> list[str]:
        args = [
            "--schedule",
            self.schedule,
            "--loop",
            self.loop,
            "--steps",
            str(self.steps),
            "--microbatches",
            str(self.microbatches),
            "--layers",
            self.layers,
            "--hidden",
            str(self.hidden),
            "--seq-len",
            str(self.seq_len),
            "--microbatch-size",
            str(self.microbatch_size),
            "--nominal-ms-per-layer",
            str(self.nominal_ms_per_layer),
            "--round-timeout",
            str(self.round_timeout_s),
            "--pg-timeout",
            str(self.pg_timeout_s),
        ]
        if self.chunks is not None:
            args += ["--chunks", str(self.chunks)]
        args += ["--server-url", server_url] if server_url else ["--no-hook"]
        return args + list(self.extra_args)

    def environment(self, trace_dir: Path | None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PERSEUS_", "ZEUS_"))}
        # The caller's clock-switching latency reaches the emulated GPUs as it is (the test
        # suite's 0, the demo's explicit value): the planner must be told the same.
        latency = os.environ.get("ZEUS_EMULATED_SWITCH_LATENCY_MS")
        if latency is not None:
            env["ZEUS_EMULATED_SWITCH_LATENCY_MS"] = latency
        env.update(
            {
                "ZEUS_GPU_BACKEND": "emulated",
                "PERSEUS_EMULATE_NOMINAL": "1" if self.nominal else "0",
                "PERSEUS_EMULATE_STRETCH": "1" if self.stretch else "0",
                "OMP_NUM_THREADS": "1",
            }
        )
        if trace_dir is not None:
            env["PERSEUS_TRACE_DIR"] = str(trace_dir)
        env.update(self.env)
        return env


def torchrun_command(
    nproc: int, args: Sequence[str], *, launcher_args: Sequence[str] = ("--standalone",)
) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node N -m perseus.train ...``.

    `launcher_args` replace ``--standalone`` (e.g. ``--nnodes 2 --node-rank 0
    --rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id JOB`` for one node of several).
    """
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *launcher_args,
        "--nproc-per-node",
        str(nproc),
        "--max-restarts",
        "0",
        "-m",
        "perseus.train",
        *args,
    ]


def run_training(
    spec: DemoJob,
    server_url: str | None,
    *,
    trace_dir: str | os.PathLike[str] | None,
    log_path: str | os.PathLike[str],
    timeout_s: float = 600.0,
    on_poll: Callable[[], None] | None = None,
) -> int:
    """Run the job under torchrun to completion; returns its exit status.

    `on_poll` is called about every 0.25 s while it runs (progress display).
    """
    require_torch()
    trace = Path(trace_dir) if trace_dir is not None else None
    if trace is not None:
        shutil.rmtree(trace, ignore_errors=True)
        trace.mkdir(parents=True)
    log = Path(log_path)
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = torchrun_command(spec.nproc, spec.train_args(server_url))
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, env=spec.environment(trace), stdout=out, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None:
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise PerseusError(
                    f"The training job did not finish within {timeout_s:g} s; log: {log}"
                )
            if on_poll is not None:
                on_poll()
            time.sleep(0.25)
    return proc.returncode
