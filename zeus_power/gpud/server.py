"""The daemon: GPU state with owners, the zeusd-subset HTTP handler, the listener.

Who undoes a setting, and when. Each connection on the Unix socket carries its peer's
credentials (``SO_PEERCRED``: pid, uid, gid, filled in by the kernel, unforgeable). A GPU
whose clocks or power limit a process changed is owned by that process (the last writer)
until it resets them; a reaper thread checks every `reap_interval_s` whether each owner
still runs (``/proc/<pid>/stat`` with the same start time, so a recycled pid does not
count, and a zombie is dead) and restores the GPU's defaults when it does not. Why pids
and not leases: zeusd's clients (Zeus's own, ours) never renew anything, so a lease would
either expire under a healthy job that holds one clock for long or outlive a dead one;
the kernel knows exactly when a process is gone. Over TCP there is no peer pid: those
settings are undone when the daemon exits, and the README says so.
"""

from __future__ import annotations

import contextlib
import hmac
import http.server
import json
import logging
import os
import signal
import socket
import socketserver
import stat
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qsl, urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from zeus_power.device import (
    GPU,
    GPUError,
    GPUNotSupportedError,
    GPUPermissionError,
    GPUValueError,
    open_gpus,
)
from zeus_power.errors import ZeusError

__all__ = ["GpudConfig", "GpudServer", "GpuState", "Peer", "run_gpud"]

logger = logging.getLogger("zeus_power.gpud")

MAX_QUERY_CHARS = 2048
"""Longest query string accepted (gpu_ids of many GPUs fit easily)."""
MAX_BODY_BYTES = 4096
"""The API takes no body; a client that sends more than this is cut off (413)."""
API_GROUPS = ("gpu-control", "gpu-read")
U32_MAX = 2**32 - 1


class GpudConfig(BaseModel):
    """How `perseus gpud` listens and what it serves."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["uds", "tcp"] = "uds"
    """``uds`` (default, zeusd's too) or ``tcp`` (needs `token`)."""
    socket_path: str = Field(default="/var/run/zeusd.sock", min_length=1, max_length=107)
    """[uds] Path of the socket (zeusd's default)."""
    socket_permissions: int = Field(default=0o660, ge=0, le=0o777)
    """[uds] Mode of the socket file: owner and group by default, never others."""
    socket_uid: int | None = Field(default=None, ge=0)
    """[uds] Owner to chown the socket to."""
    socket_gid: int | None = Field(default=None, ge=0)
    """[uds] Group to chown the socket to (the group of users allowed to set clocks)."""
    tcp_bind_address: str = "127.0.0.1:4938"
    """[tcp] host:port to listen on."""
    token: SecretStr | None = None
    """Bearer token required on every endpoint but /discover; mandatory over TCP."""
    reap_interval_s: float = Field(default=0.5, gt=0, le=60)
    """How often the owners of changed GPUs are checked."""


@dataclass(frozen=True)
class Peer:
    """The process at the other end of a Unix-socket connection."""

    pid: int
    uid: int
    start_ticks: str
    """Field 22 of /proc/<pid>/stat: tells a pid's reuse from the original process."""


def _start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks; None when it is gone (or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return fields[19]


def peer_of(sock: socket.socket) -> Peer | None:
    """The peer of a Unix-socket connection (Linux ``SO_PEERCRED``); None elsewhere."""
    option = getattr(socket, "SO_PEERCRED", None)
    if sock.family != socket.AF_UNIX or option is None:
        return None
    pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, option, 12))
    ticks = _start_ticks(pid) if pid > 0 else None
    return None if ticks is None else Peer(pid, uid, ticks)


def _alive(peer: Peer) -> bool:
    return _start_ticks(peer.pid) == peer.start_ticks


@dataclass
class _Slot:
    """One GPU and what the daemon changed on it."""

    gpu: GPU
    clocks_locked: bool = False
    power_limit_set: bool = False
    owner: Peer | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class RequestError(ZeusError):
    """A whole request refused: status, body, content type (zeusd's shapes).

    Internal to the handler, which turns it into the answer; never leaves the daemon.
    """

    def __init__(self, status: int, body: Any, *, plain: bool = False) -> None:
        super().__init__(str(body))
        self.status = status
        self.body = body
        self.plain = plain


def _gpu_status(exc: GPUError) -> int:
    """zeusd's status for an NVML error: bad value/unsupported 400, no permission 403."""
    if isinstance(exc, GPUValueError | GPUNotSupportedError):
        return 400
    if isinstance(exc, GPUPermissionError):
        return 403
    return 500


class GpuState:
    """The GPUs, what was changed on each and by whom; every write checked first."""

    def __init__(self, gpus: Sequence[GPU]) -> None:
        self.slots: dict[int, _Slot] = {}
        for gpu in gpus:
            self.slots[int(getattr(gpu, "nvml_index", gpu.index))] = _Slot(gpu)
        self._clocks = {i: set(s.gpu.supported_sm_clocks_mhz()) for i, s in self.slots.items()}
        self._ranges = {i: s.gpu.power_limit_constraints_mw() for i, s in self.slots.items()}

    # -- validation (before anything reaches a GPU) ------------------------------------------
    def check_clocks(self, index: int, min_mhz: int, max_mhz: int) -> None:
        clocks = self._clocks[index]
        for name, value in (("min_clock_mhz", min_mhz), ("max_clock_mhz", max_mhz)):
            if value not in clocks:
                raise GPUValueError(
                    f"Invalid argument: {name}={value} is not a supported SM clock of GPU "
                    f"{index} (supported: {len(clocks)} clocks in {min(clocks)}..{max(clocks)} MHz)"
                )
        if min_mhz > max_mhz:
            raise GPUValueError(
                f"Invalid argument: min_clock_mhz={min_mhz} exceeds max_clock_mhz={max_mhz}"
            )

    def check_power_limit(self, index: int, limit_mw: int) -> None:
        low, high = self._ranges[index]
        if not low <= limit_mw <= high:
            raise GPUValueError(
                f"Invalid argument: power_limit_mw={limit_mw} is outside GPU {index}'s range "
                f"{low}..{high} mW"
            )

    # -- writes -----------------------------------------------------------------------------
    def write(
        self, what: str, indices: Sequence[int], params: dict[str, int], peer: Peer | None
    ) -> dict[int, GPUError]:
        """Apply one write to each GPU; the per-GPU errors (the others are applied)."""
        errors: dict[int, GPUError] = {}
        for index in indices:
            slot = self.slots[index]
            try:
                with slot.lock:
                    self._apply(what, index, slot, params)
                    if slot.clocks_locked or slot.power_limit_set:
                        slot.owner = peer
                    else:
                        slot.owner = None
            except GPUError as exc:
                errors[index] = exc
        who = f"pid {peer.pid} (uid {peer.uid})" if peer else "a TCP client"
        logger.info(
            "%s %s on GPUs %s by %s%s",
            what,
            params,
            list(indices),
            who,
            f": {len(errors)} refused" if errors else "",
        )
        return errors

    def _apply(self, what: str, index: int, slot: _Slot, params: dict[str, int]) -> None:
        gpu = slot.gpu
        if what == "set_gpu_locked_clocks":
            self.check_clocks(index, params["min_clock_mhz"], params["max_clock_mhz"])
            gpu.lock_sm_clocks(params["min_clock_mhz"], params["max_clock_mhz"])
            slot.clocks_locked = True
        elif what == "reset_gpu_locked_clocks":
            gpu.reset_sm_clocks()
            slot.clocks_locked = False
        elif what == "set_power_limit":
            self.check_power_limit(index, params["power_limit_mw"])
            gpu.set_power_limit_mw(params["power_limit_mw"])
            slot.power_limit_set = params["power_limit_mw"] != gpu.default_power_limit_mw()
        else:  # pragma: no cover - the handler only routes the three writes
            raise GPUNotSupportedError(f"unknown write {what}")

    # -- undoing ------------------------------------------------------------------------------
    def restore(self, index: int, why: str) -> None:
        """Reset the clocks and power limit this daemon changed on one GPU."""
        slot = self.slots[index]
        with slot.lock:
            try:
                if slot.clocks_locked:
                    slot.gpu.reset_sm_clocks()
                    slot.clocks_locked = False
                if slot.power_limit_set:
                    slot.gpu.set_power_limit_mw(slot.gpu.default_power_limit_mw())
                    slot.power_limit_set = False
                slot.owner = None
            except GPUError as exc:
                logger.error("GPU %d: could not restore its defaults (%s): %s", index, why, exc)
                return
        logger.info("GPU %d: clocks and power limit restored to defaults (%s)", index, why)

    def reap(self) -> list[int]:
        """Restore every GPU whose owner process is gone; the GPUs restored."""
        gone = []
        for index, slot in self.slots.items():
            owner = slot.owner
            if owner is not None and not _alive(owner):
                self.restore(index, f"client pid {owner.pid} exited")
                gone.append(index)
        return gone

    def log_states(self, when: str) -> None:
        """One line per GPU: clock and power limit in force, what this daemon changed."""
        for index, slot in sorted(self.slots.items()):
            gpu = slot.gpu
            clock = getattr(gpu, "current_sm_clock_mhz", None)
            changed = [
                n
                for n, f in (("clocks", slot.clocks_locked), ("power limit", slot.power_limit_set))
                if f
            ]
            logger.info(
                "GPU %d %s: SM clock %s MHz, power limit %d mW (default %d), changed: %s",
                index,
                when,
                clock() if clock is not None else "?",
                gpu.get_power_limit_mw(),
                gpu.default_power_limit_mw(),
                ", ".join(changed) or "nothing",
            )

    def restore_all(self, why: str) -> None:
        for index, slot in self.slots.items():
            if slot.clocks_locked or slot.power_limit_set:
                self.restore(index, why)


# -- the HTTP side ---------------------------------------------------------------------------
def _u32(name: str, raw: str | None) -> int:
    if raw is None:
        raise RequestError(400, f"Query deserialize error: missing field `{name}`", plain=True)
    if not raw.isdigit() or len(raw) > 10 or int(raw) > U32_MAX:
        raise RequestError(
            400,
            f"Query deserialize error: {name}: invalid digit found in {raw[:40]!r} "
            "(expected an unsigned 32-bit integer)",
            plain=True,
        )
    return int(raw)


def _bool(name: str, raw: str | None) -> bool:
    if raw is None:
        raise RequestError(400, f"Query deserialize error: missing field `{name}`", plain=True)
    if raw not in ("true", "false"):
        raise RequestError(
            400,
            f"Query deserialize error: {name}: expected `true` or `false`, got {raw[:40]!r}",
            plain=True,
        )
    return raw == "true"


def _gpu_ids(raw: str | None, known: Sequence[int], *, write: bool) -> list[int]:
    """Parse ``gpu_ids``: required on writes, all GPUs when absent on reads."""
    if raw is None:
        if write:
            raise RequestError(400, "Query deserialize error: missing field `gpu_ids`", plain=True)
        return list(known)
    ids: list[int] = []
    for part in raw.split(","):
        part = part.strip()
        if not part.isdigit() or len(part) > 6:
            raise RequestError(400, {"error": f"gpu_ids: {part[:40]!r} is not a GPU index"})
        if int(part) not in ids:
            ids.append(int(part))
    if not ids:
        raise RequestError(400, {"error": "gpu_ids must contain at least one GPU index"})
    for index in ids:
        if index not in known:
            if write:  # zeusd's GpuNotFoundError: plain text
                raise RequestError(400, f"GPU index {index} does not exist.", plain=True)
            raise RequestError(400, {"error": f"GPU {index} not found"})
    return ids


_WRITES = {
    "/gpu/set_gpu_locked_clocks": ("min_clock_mhz", "max_clock_mhz"),
    "/gpu/reset_gpu_locked_clocks": (),
    "/gpu/set_power_limit": ("power_limit_mw",),
}
_READS: dict[str, Callable[[GPU], dict[str, int]]] = {
    "/gpu/get_cumulative_energy": lambda g: {"energy_mj": g.total_energy_mj()},
    "/gpu/get_power_limit": lambda g: {"power_limit_mw": g.get_power_limit_mw()},
    "/gpu/get_power_limit_constraints": lambda g: dict(
        zip(
            ("min_power_limit_mw", "max_power_limit_mw"),
            g.power_limit_constraints_mw(),
            strict=True,
        )
    ),
}


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Any  # the listener, carrying `config`, `state` and `discovery`
    protocol_version = "HTTP/1.1"
    server_version = "perseus-gpud"
    sys_version = ""
    timeout = 600  # an idle keep-alive connection is closed after this (the client reconnects)

    def version_string(self) -> str:
        return self.server_version

    def handle(self) -> None:
        try:
            super().handle()
        except (BrokenPipeError, ConnectionResetError, TimeoutError) as exc:
            logger.debug("%s went away: %s", self.address_string(), exc)

    def setup(self) -> None:
        super().setup()
        self.peer = peer_of(self.connection)

    def address_string(self) -> str:
        if self.peer is not None:
            return f"pid {self.peer.pid}"
        return str(self.client_address[0]) if isinstance(self.client_address, tuple) else "unix"

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s", self.address_string(), format % args)

    # -- plumbing -----------------------------------------------------------------------------
    def _send(
        self, status: int, body: Any, *, plain: bool = False, headers: dict[str, str] | None = None
    ) -> None:
        data = (str(body) if plain else json.dumps(body)).encode()
        if status == 200 and body is None:
            data = b""
        self.send_response(status)
        self.send_header(
            "Content-Type", "text/plain; charset=utf-8" if plain else "application/json"
        )
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if data:
            self.wfile.write(data)

    def _drain(self) -> bool:
        raw = self.headers.get("Content-Length", "0") or "0"
        length = int(raw) if raw.isdigit() else MAX_BODY_BYTES + 1
        if length > MAX_BODY_BYTES or self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            self._send(413, {"error": f"the API takes no body (at most {MAX_BODY_BYTES} bytes)"})
            return False
        if length:
            self.rfile.read(length)
        return True

    def _authorized(self, path: str) -> bool:
        token = self.server.config.token
        if token is None or path == "/discover":
            return True
        given = self.headers.get("Authorization", "")
        if not given.startswith("Bearer "):
            self._send(
                401,
                {
                    "error": "Authentication required. Provide an Authorization: Bearer <token> header."
                },
                headers={"WWW-Authenticate": 'Bearer realm="zeusd"'},
            )
            return False
        if not hmac.compare_digest(given[7:].encode(), token.get_secret_value().encode()):
            self._send(
                401,
                {"error": "Invalid token."},
                headers={"WWW-Authenticate": 'Bearer realm="zeusd"'},
            )
            return False
        return True

    def _handle(self, method: str) -> None:
        if not self._drain():
            return
        url = urlsplit(self.path)
        if len(url.query) > MAX_QUERY_CHARS:
            self._send(414, {"error": f"query longer than {MAX_QUERY_CHARS} characters"})
            return
        if not self._authorized(url.path):
            return
        try:
            pairs = parse_qsl(
                url.query, keep_blank_values=True, strict_parsing=bool(url.query), max_num_fields=16
            )
        except ValueError as exc:
            self._send(400, f"Query deserialize error: {exc}", plain=True)
            return
        query = dict(pairs)
        try:
            status, body = self._route(method, url.path, query, len(pairs))
        except RequestError as exc:
            self._send(exc.status, exc.body, plain=exc.plain)
            return
        self._send(status, body)

    def _route(self, method: str, path: str, query: dict[str, str], n: int) -> tuple[int, Any]:
        state = self.server.state
        known = sorted(state.slots)
        if path == "/discover" and method == "GET":
            return 200, self.server.discovery()
        if path in _WRITES and method == "POST":
            fields = _WRITES[path]
            allowed = {"gpu_ids", "block", *fields}
            unknown = sorted(set(query) - allowed)
            if unknown or n != len(query):
                raise RequestError(
                    400,
                    f"Query deserialize error: unknown or repeated field `{(unknown or ['?'])[0]}`, "
                    f"expected {sorted(allowed)}",
                    plain=True,
                )
            params = {name: _u32(name, query.get(name)) for name in fields}
            _bool("block", query.get("block"))
            ids = _gpu_ids(query.get("gpu_ids"), known, write=True)
            errors = state.write(path.removeprefix("/gpu/"), ids, params, self.peer)
            if errors:
                worst = max(_gpu_status(e) for e in errors.values())
                return worst, {"errors": {str(i): str(e) for i, e in errors.items()}}
            return 200, None
        if (path in _READS or path == "/gpu/get_power") and method == "GET":
            unknown = sorted(set(query) - {"gpu_ids"})
            if unknown:
                raise RequestError(
                    400, f"Query deserialize error: unknown field `{unknown[0]}`", plain=True
                )
            ids = _gpu_ids(query.get("gpu_ids"), known, write=False)
            out: dict[str, Any] = {}
            errors: dict[str, str] = {}
            statuses = []
            for index in ids:
                gpu = state.slots[index].gpu
                try:
                    if path == "/gpu/get_power":
                        out[str(index)] = gpu.power_usage_mw()
                    else:
                        out[str(index)] = _READS[path](gpu)
                except GPUError as exc:
                    errors[str(index)] = str(exc)
                    statuses.append(_gpu_status(exc))
            if errors:
                return max(statuses), {"errors": errors}
            if path == "/gpu/get_power":
                return 200, {"timestamp_ms": int(time.time() * 1000), "power_mw": out}
            return 200, out
        if path in _WRITES or path in _READS or path in ("/discover", "/gpu/get_power"):
            raise RequestError(405, {"error": f"{method} is not allowed on {path}"})
        raise RequestError(404, {"error": f"No such endpoint: {path[:100]}"})

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_OPTIONS(self) -> None:
        self._handle("OPTIONS")

    def do_HEAD(self) -> None:
        self.close_connection = True  # the 405's body must not be read as the next answer
        self._handle("HEAD")


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
        self._listener.discovery = self.discovery  # type: ignore[attr-defined]

    @property
    def address(self) -> str:
        c = self.config
        if c.mode == "uds":
            return f"unix:{c.socket_path}"
        host, port = self._listener.server_address[:2]
        return f"tcp:{host}:{port}"

    def discovery(self) -> dict[str, Any]:
        return {
            "gpus": [
                {
                    "id": index,
                    "name": slot.gpu.name(),
                    "cumulative_energy_available": slot.gpu.supports_energy_counter(),
                }
                for index, slot in sorted(self.state.slots.items())
            ],
            "cpus": [],
            "enabled_api_groups": list(API_GROUPS),
            "auth_required": self.config.token is not None,
        }

    def _bind(self) -> socketserver.BaseServer:
        c = self.config
        if c.mode == "tcp":
            host, _, port = c.tcp_bind_address.rpartition(":")
            if not host or not port.isdigit() or not 0 <= int(port) < 65536:
                raise GPUValueError(f"--tcp-bind-address {c.tcp_bind_address!r} is not host:port")
            return _TCPServer((host.strip("[]"), int(port)), _Handler)
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
            server = _UnixServer(path, _Handler, bind_and_activate=True)
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
