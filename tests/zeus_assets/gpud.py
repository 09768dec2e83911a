"""A real `perseus gpud` process for tests: emulated GPUs, a Unix socket (or TCP), its log."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

__all__ = ["Gpud"]


class Gpud:
    """``python -m perseus gpud --backend emulated ...`` until `stop` (SIGTERM).

    The socket lives in a short /tmp directory (Unix socket paths are limited to 107
    bytes, pytest's tmp_path can be longer). `client()` is an httpx client on it.
    """

    def __init__(
        self,
        *,
        gpus: int = 2,
        gpu_type: str = "A40",
        tcp_port: int | None = None,
        token_file: Path | None = None,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="gpud", dir="/tmp"))
        self.sock = str(self.dir / "gpud.sock")
        self.log_path = self.dir / "gpud.log"
        self.tcp_port = tcp_port
        args = [
            sys.executable, "-m", "perseus", "gpud", "--backend", "emulated",
            "--emulated-gpu", gpu_type, "--emulated-gpus", str(gpus),
            "--socket-path", self.sock, "--reap-interval", "0.1",
        ]  # fmt: skip
        if tcp_port is not None:
            args += ["--mode", "tcp", "--tcp-bind-address", f"127.0.0.1:{tcp_port}"]
        if token_file is not None:
            args += ["--token-file", str(token_file)]
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [*args, *extra_args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )

    def wait_ready(self, timeout_s: float = 60.0) -> Gpud:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gpud exited {self.proc.returncode}: {self.log()}")
            try:
                if self.tcp_port is None:
                    with socket.socket(socket.AF_UNIX) as s:
                        s.connect(self.sock)
                else:
                    socket.create_connection(("127.0.0.1", self.tcp_port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"gpud did not start: {self.log()}")

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if self.tcp_port is not None:
            return httpx.Client(base_url=f"http://127.0.0.1:{self.tcp_port}", headers=headers)
        return httpx.Client(
            transport=httpx.HTTPTransport(uds=self.sock), base_url="http://gpud", headers=headers
        )

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout_s: float = 20.0) -> int:
        """SIGTERM, wait; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        finally:
            self._log.close()

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
