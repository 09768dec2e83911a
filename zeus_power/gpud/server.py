"""The daemon's process: the listener (Unix socket or TCP), the reaper, start and stop.

`GpudServer` binds the socket (refusing to replace a file that is not a socket or a live
daemon's socket), serves each connection on its own thread with
`zeus_power.gpud.handler.Handler`, at most `GpudConfig.max_connections` at once (one more
is answered 503), runs the reaper every `reap_interval_s`, and when stopped refuses further
writes, restores every GPU it changed and removes the socket. `run_gpud` opens the GPUs and
serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import contextlib
import http.server
import logging
import math
import os
import signal
import socket
import socketserver
import stat
import threading
import time
from collections.abc import Sequence
from typing import Any

from zeus_power.device import GPU, open_gpus
from zeus_power.errors import ZeusConfigError
from zeus_power.gpud.config import GpudConfig
from zeus_power.gpud.handler import Handler, Overloaded
from zeus_power.gpud.state import GpuState

__all__ = ["REFUSERS", "GpudServer", "run_gpud"]

logger = logging.getLogger("zeus_power.gpud")

REFUSERS = 4
"""Threads that may answer 503 at once to connections beyond `max_connections`."""


class _Bounded:
    """Each connection on its own thread, at most `max_connections` at once.

    A connection beyond them is still answered, on one of `REFUSERS` short-lived threads: its
    request gets zeusd's error shape with 503 and the connection is closed (the request is
    read first, so the client sees the answer rather than a reset connection). Beyond those
    too, the connection is closed at once. A warning says so at most once a minute.
    """

    config: GpudConfig
    state: GpuState

    def _init_bounds(self, config: GpudConfig, state: GpuState) -> None:
        """Called once, right after the socketserver's own constructor: the daemon's
        settings and the GPU state its handlers serve."""
        self.config = config
        self.state = state
        self._slots = threading.BoundedSemaphore(config.max_connections)
        self._refusers = threading.BoundedSemaphore(REFUSERS)
        self._refused = 0
        self._warned_at_s = -math.inf

    def process_request(self, request: Any, client_address: Any) -> None:
        if self._slots.acquire(blocking=False):
            handler, release = Handler, self._slots
        else:
            self._overloaded()
            if not self._refusers.acquire(blocking=False):
                self.shutdown_request(request)  # type: ignore[attr-defined]
                return
            handler, release = Overloaded, self._refusers
        thread = threading.Thread(
            target=self._serve,
            args=(handler, release, request, client_address),
            name="gpud-connection",
            daemon=True,
        )
        try:
            thread.start()
        except BaseException:  # no thread to release the slot: release it here
            release.release()
            raise

    def _serve(
        self,
        handler: type[Handler],
        release: threading.BoundedSemaphore,
        request: Any,
        client_address: Any,
    ) -> None:
        try:
            handler(request, client_address, self)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            # The slot first: a client that sees its connection closed may connect again at
            # once, and must find the slot free (closing first answered that client 503).
            release.release()
            self.shutdown_request(request)  # type: ignore[attr-defined]

    def _overloaded(self) -> None:
        self._refused += 1
        now = time.monotonic()
        if now - self._warned_at_s >= 60:
            logger.warning(
                "all %d connection slots are busy: %d connection(s) answered 503 since the last "
                "such warning. Raise --max-connections if the clients need more at once, or look for "
                "a client that opens connections without closing them",
                self.config.max_connections,
                self._refused,
            )
            self._warned_at_s, self._refused = now, 0

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Log a handler's unexpected error instead of printing a traceback to stderr."""
        logger.exception("error while serving a request")


class _UnixServer(_Bounded, socketserver.UnixStreamServer):
    allow_reuse_address = False


class _TCPServer(_Bounded, http.server.HTTPServer):
    pass


class GpudServer:
    """The listener, the GPU state and the reaper; `serve` runs until `stop`."""

    def __init__(self, config: GpudConfig, gpus: Sequence[GPU]) -> None:
        self.config = config
        self.state = GpuState(gpus)
        self._stop = threading.Event()
        self._listener = self._bind()
        self._listener._init_bounds(config, self.state)

    @property
    def address(self) -> str:
        c = self.config
        if c.mode == "uds":
            return f"unix:{c.socket_path}"
        host, port = self._listener.server_address[:2]
        return f"tcp:{host}:{port}"

    def _bind(self) -> _Bounded:
        c = self.config
        if c.mode == "tcp":
            return _TCPServer(c.tcp_host_port, Handler)
        path = c.socket_path
        if os.path.lexists(path):
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                raise ZeusConfigError(f"{path} exists and is not a socket; refusing to replace it")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(path)
            except OSError:
                os.unlink(path)  # a stale socket of a daemon that died
            else:
                raise ZeusConfigError(f"Another daemon is listening on {path}")
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
            self.state.close("daemon exiting")
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
        raise ZeusConfigError(f"--backend {backend!r}: use nvml or emulated")
    indices = list(range(emulated_gpus)) if backend == "emulated" else None
    gpus = open_gpus(indices, backend=backend, gpu_type=emulated_gpu)
    server = GpudServer(config, gpus)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: server.stop())
    server.serve()
