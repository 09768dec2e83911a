"""The zeusd HTTP client: where the daemon is (`ZeusdSettings`, Zeus's ``ZEUSD_*``
variables), one keep-alive connection to it (`ZeusdClient`), and its error answers mapped
to the `GPUError` tree in one place (`_raise_for`).

The wire protocol is zeusd's HTTP API as its documentation gives it for zeusd 0.5
(query-parameter writes to ``POST /gpu/{set,reset}_*`` with ``gpu_ids`` and ``block``; ``GET /discover``
listing ``gpus`` with ``id`` and ``name``; ``GET /gpu/get_cumulative_energy`` and
``/gpu/get_power_limit`` keyed by GPU id; errors as ``{"errors": {"<id>": msg}}``,
``{"error": msg}`` or plain text with 400/401/403/404/500). Only the subset used is here.
HTTP is stdlib `http.client` (the device layer takes no httpx dependency).
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
from typing import Any
from urllib.parse import urlencode

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from zeus_power.device.base import (
    GPUError,
    GPUInitError,
    GPUNotSupportedError,
    GPUPermissionError,
    GPUValueError,
    load_env_settings,
)

__all__ = ["DEFAULT_TCP_PORT", "ZeusdClient", "ZeusdSettings", "load_zeusd_settings"]

DEFAULT_TCP_PORT = 4938
"""zeusd's default TCP port."""
MAX_RESPONSE_BYTES = 1 << 20
"""Longest daemon answer read (a discover of many GPUs fits easily)."""
_UNIX_PATH_MAX = 107
_HOST_PORT = re.compile(
    r"^(?P<host>[A-Za-z0-9._-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\])(?::(?P<port>\d{1,5}))?$"
)


class ZeusdSettings(BaseSettings):
    """Where the daemon is, from Zeus's `ZEUSD_*` environment variables."""

    model_config = SettingsConfigDict(env_prefix="ZEUSD_", extra="ignore", frozen=True)

    sock_path: str | None = Field(default=None, min_length=1, max_length=_UNIX_PATH_MAX)
    """`ZEUSD_SOCK_PATH`: the daemon's Unix socket (takes priority over TCP)."""
    host_port: str | None = Field(default=None, max_length=260)
    """`ZEUSD_HOST_PORT`: ``host:port`` of a daemon listening on TCP (port default 4938)."""
    token: SecretStr | None = Field(default=None, max_length=8192)
    """`ZEUSD_TOKEN`: bearer token sent in ``Authorization`` (never logged)."""
    timeout_s: float = Field(default=10.0, gt=0, le=600)
    """`ZEUSD_TIMEOUT_S`: seconds one request may take."""

    @field_validator("host_port")
    @classmethod
    def _check_host_port(cls, value: str | None) -> str | None:
        if value is None:
            return None
        match = _HOST_PORT.match(value.strip())
        if match is None or not 0 < int(match["port"] or DEFAULT_TCP_PORT) < 65536:
            raise ValueError(f"{value!r} is not host:port (e.g. node1:{DEFAULT_TCP_PORT})")
        return value.strip()

    @property
    def configured(self) -> bool:
        """Whether a daemon address is set."""
        return bool(self.sock_path or self.host_port)

    def describe(self) -> str:
        """The daemon's address for messages (no token)."""
        if self.sock_path:
            return f"zeusd at unix:{self.sock_path}"
        return f"zeusd at tcp:{self.host_port}"


def load_zeusd_settings() -> ZeusdSettings:
    """The `ZEUSD_*` settings; `GPUValueError` naming the bad variable."""
    return load_env_settings(ZeusdSettings, "zeusd")


class _UnixHTTPConnection(http.client.HTTPConnection):
    """`http.client` over a Unix socket (the Host header is a placeholder)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def _message(body: bytes) -> str:
    """The daemon's error text: per-GPU ``errors``, one ``error``, or the plain body."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return text[:2000] or "(empty answer)"
    if isinstance(data, dict) and isinstance(data.get("errors"), dict):
        return "; ".join(f"GPU {k}: {v}" for k, v in sorted(data["errors"].items()))[:2000]
    if isinstance(data, dict) and "error" in data:
        return str(data["error"])[:2000]
    return text[:2000]


def _error_gpu(body: bytes) -> int | None:
    """The GPU a per-GPU error body names, when it names exactly one."""
    try:
        data = json.loads(body)
        errors = data["errors"]
        if isinstance(errors, dict) and len(errors) == 1:
            return int(next(iter(errors)))
    except (ValueError, KeyError, TypeError):
        pass
    return None


class ZeusdClient:
    """One keep-alive connection to the daemon, shared by this process's `ZeusdGPU`s.

    Thread-safe (one request at a time). Every request that fails to connect or loses
    the connection is retried once on a fresh one: all the calls used set absolute values,
    so repeating one is harmless.
    """

    def __init__(self, settings: ZeusdSettings) -> None:
        if not settings.configured:
            raise GPUInitError(
                "No zeusd address: set ZEUSD_SOCK_PATH (Unix socket) or ZEUSD_HOST_PORT "
                "(host:port) to reach the daemon"
            )
        self.settings = settings
        self.where = settings.describe()
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        s = self.settings
        if s.sock_path:
            return _UnixHTTPConnection(s.sock_path, timeout=s.timeout_s)
        match = _HOST_PORT.match(s.host_port or "")
        if match is None:  # the settings check it; a hand-built one may not have
            raise GPUInitError(f"ZEUSD_HOST_PORT {s.host_port!r} is not host:port")
        host = match["host"].strip("[]")
        return http.client.HTTPConnection(
            host, int(match["port"] or DEFAULT_TCP_PORT), timeout=s.timeout_s
        )

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def request(self, method: str, path: str, params: dict[str, Any] | None = None) -> Any:
        """One call; the decoded JSON answer (None for an empty 200). Errors: `GPUError`s."""
        query = f"?{urlencode(params)}" if params else ""
        headers = {"Content-Length": "0"}
        if self.settings.token is not None:
            headers["Authorization"] = f"Bearer {self.settings.token.get_secret_value()}"
        with self._lock:
            for attempt in (0, 1):
                if self._conn is None:
                    self._conn = self._connect()
                try:
                    self._conn.request(method, path + query, headers=headers)
                    response = self._conn.getresponse()
                    body = response.read(MAX_RESPONSE_BYTES + 1)
                    break
                except (OSError, http.client.HTTPException) as exc:
                    self._conn.close()
                    self._conn = None
                    if attempt == 1:
                        raise GPUInitError(
                            f"Cannot reach {self.where}: {exc}. Is the daemon running, and may "
                            "this user open its socket (see docs/operating.md, Running without root)?"
                        ) from exc
            if response.getheader("Connection", "").lower() == "close":
                self._conn.close()
                self._conn = None
        if len(body) > MAX_RESPONSE_BYTES:
            self.close()
            raise GPUError(
                f"{self.where} answered {path} with more than {MAX_RESPONSE_BYTES} bytes"
            )
        if response.status != 200:
            _raise_for(response.status, body, f"{self.where}, {method} {path}")
        if not body.strip():
            return None
        try:
            return json.loads(body)
        except ValueError as exc:
            raise GPUError(f"{self.where} answered {path} with non-JSON: {body[:200]!r}") from exc

    # -- the API subset ---------------------------------------------------------------------
    def discover(self) -> dict[str, Any]:
        """``GET /discover``, normalised to ``gpus: [{"id": ..., "name": ...}]``.

        zeusd 0.5's documentation lists ``gpus`` objects; an earlier zeusd answers a bare
        ``gpu_ids`` list, taken here as GPUs without a name.
        """
        data = self.request("GET", "/discover")
        gpus, ids = (data.get("gpus"), data.get("gpu_ids")) if isinstance(data, dict) else (0, 0)
        if not isinstance(gpus, list) and isinstance(ids, list):
            data = {**data, "gpus": [{"id": i, "name": ""} for i in data["gpu_ids"]]}
        if not isinstance(data, dict) or not isinstance(data.get("gpus"), list):
            raise GPUInitError(f"{self.where}: /discover did not list gpus: {str(data)[:200]}")
        return data

    def write(self, what: str, gpu_index: int, **params: int) -> None:
        """``POST /gpu/<what>?gpu_ids=<index>&...&block=true``."""
        self.request("POST", f"/gpu/{what}", {"gpu_ids": str(gpu_index), **params, "block": "true"})

    def read(self, what: str, gpu_index: int, field: str) -> int:
        """``GET /gpu/<what>?gpu_ids=<index>`` → that GPU's `field`."""
        data = self.request("GET", f"/gpu/{what}", {"gpu_ids": str(gpu_index)})
        try:
            return int(data[str(gpu_index)][field])
        except (KeyError, TypeError, ValueError) as exc:
            raise GPUError(
                f"{self.where}: /gpu/{what} gave no {field} for GPU {gpu_index}: {str(data)[:200]}",
                gpu_index=gpu_index,
            ) from exc


def _raise_for(status: int, body: bytes, where: str) -> None:
    """Map a daemon error answer to the GPU error tree (the only place that does it)."""
    message = f"{where} answered {status}: {_message(body)}"
    gpu_index = _error_gpu(body)
    if status == 401:
        raise GPUPermissionError(f"{message}. Set ZEUSD_TOKEN to a token the daemon accepts")
    if status == 403:
        raise GPUPermissionError(message, gpu_index=gpu_index)
    if status == 400:
        raise GPUValueError(message, gpu_index=gpu_index)
    if status in (404, 405):
        raise GPUNotSupportedError(message, gpu_index=gpu_index)
    raise GPUError(message, gpu_index=gpu_index)
