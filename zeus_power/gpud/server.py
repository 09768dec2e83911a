"""The daemon's process: the listener (Unix socket or TCP), the reaper, start and stop.

`GpudServer` binds the socket (refusing to replace a file that is not a socket or a live
daemon's socket), serves each connection with `zeus_power.gpud.handler.Handler`, runs the
reaper every `reap_interval_s`, and when stopped restores every GPU it changed and removes
the socket. `run_gpud` opens the GPUs and serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import contextlib
import http.server
import logging
import os
import signal
import socket
import socketserver
import stat
import threading
from collections.abc import Sequence
from typing import Any

from zeus_power.device import GPU, GPUValueError, open_gpus
from zeus_power.gpud.config import GpudConfig
from zeus_power.gpud.handler import Handler
from zeus_power.gpud.state import GpuState

__all__ = ["GpudServer", "run_gpud"]

logger = logging.getLogger("zeus_power.gpud")


class _Quiet:
    """Log a handler's unexpected error instead of printing a traceback to stderr."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        logger.exception("error while serving a request")


class _UnixServer(_Quiet, socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = False


class _TCPServer(_Quiet, socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


class GpudServer:
    """The listener, the GPU state and the reaper; `serve` runs until `stop`."""

    def __init__(self, config: GpudConfig, gpus: Sequence[GPU]) -> None:
        if config.mode == "tcp" and config.token is None:
            raise GPUValueError(
                "TCP mode needs a token (--token-file): anyone who can reach the port could "
                "otherwise slow the GPUs down. Use the Unix socket for local jobs"
            )
        self.config = config
        self.state = GpuState(gpus)
        self._stop = threading.Event()
        self._listener = self._bind()
        self._listener.config = config  # type: ignore[attr-defined]
        self._listener.state = self.state  # type: ignore[attr-defined]

    @property
    def address(self) -> str:
        c = self.config
        if c.mode == "uds":
            return f"unix:{c.socket_path}"
        host, port = self._listener.server_address[:2]
        return f"tcp:{host}:{port}"

    def _bind(self) -> socketserver.BaseServer:
        c = self.config
        if c.mode == "tcp":
            host, _, port = c.tcp_bind_address.rpartition(":")
            if not host or not port.isdigit() or not 0 <= int(port) < 65536:
                raise GPUValueError(f"--tcp-bind-address {c.tcp_bind_address!r} is not host:port")
            return _TCPServer((host.strip("[]"), int(port)), Handler)
        path = c.socket_path
        if os.path.lexists(path):
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                raise GPUValueError(f"{path} exists and is not a socket; refusing to replace it")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(path)
            except OSError:
                os.unlink(path)  # a stale socket of a daemon that died
            else:
                raise GPUValueError(f"Another daemon is listening on {path}")
            finally:
                probe.close()
        old = os.umask(0o177)  # no window in which the socket is more open than asked
        try:
            server = _UnixServer(path, Handler, bind_and_activate=True)
        finally:
            os.umask(old)
        if c.socket_uid is not None or c.socket_gid is not None:
            os.chown(
                path,
                -1 if c.socket_uid is None else c.socket_uid,
                -1 if c.socket_gid is None else c.socket_gid,
            )
        os.chmod(path, c.socket_permissions)
        if c.socket_permissions & 0o002:
            logger.warning("%s is world-writable: any local user can change GPU clocks", path)
        return server

    def _reaper(self) -> None:
        while not self._stop.wait(self.config.reap_interval_s):
            self.state.reap()

    def serve(self) -> None:
        """Serve until `stop`; then restore every GPU and remove the socket."""
        listener = threading.Thread(
            target=self._listener.serve_forever,
            name="gpud-listener",
            kwargs={"poll_interval": 0.2},
            daemon=True,
        )
        reaper = threading.Thread(target=self._reaper, name="gpud-reaper", daemon=True)
        listener.start()
        reaper.start()
        logger.info(
            "perseus gpud listening on %s (%d GPUs: %s)",
            self.address,
            len(self.state.slots),
            sorted(self.state.slots),
        )
        try:
            self._stop.wait()
        finally:
            self._listener.shutdown()
            self._listener.server_close()
            reaper.join()
            self.state.log_states("at exit")
            self.state.restore_all("daemon exiting")
            if self.config.mode == "uds":
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.config.socket_path)
            logger.info("perseus gpud stopped")

    def stop(self) -> None:
        self._stop.set()


def run_gpud(
    config: GpudConfig,
    *,
    backend: str = "nvml",
    emulated_gpu: str | None = None,
    emulated_gpus: int = 1,
) -> None:
    """Open the GPUs, listen, and serve until SIGTERM or SIGINT (then restore the GPUs)."""
    if backend not in ("nvml", "emulated"):
        raise GPUValueError(f"--backend {backend!r}: use nvml or emulated")
    indices = list(range(emulated_gpus)) if backend == "emulated" else None
    gpus = open_gpus(indices, backend=backend, gpu_type=emulated_gpu)
    server = GpudServer(config, gpus)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: server.stop())
    server.serve()
