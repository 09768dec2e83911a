"""GPUs whose privileged calls go through a Zeus daemon (`zeusd`, or `perseus gpud`).

Locking SM clocks and setting power limits need root or CAP_SYS_ADMIN; a training job
rarely has either. A privileged daemon on the node does those writes for it over HTTP on a
Unix socket (`ZEUSD_SOCK_PATH`) or TCP (`ZEUSD_HOST_PORT`, ``host:port``), with an optional
bearer token (`ZEUSD_TOKEN`). These are the variable names of Zeus's own client.

The wire protocol is zeusd's HTTP API as its documentation gives it for zeusd 0.5
(query-parameter writes to ``POST /gpu/{set,reset}_*`` with ``gpu_ids`` and ``block``; ``GET /discover``
listing ``gpus`` with ``id`` and ``name``; ``GET /gpu/get_cumulative_energy`` and
``/gpu/get_power_limit`` keyed by GPU id; errors as ``{"errors": {"<id>": msg}}``,
``{"error": msg}`` or plain text with 400/401/403/404/500). Only the subset below is used.

Reads stay local where they can: on a real GPU through NVML (no privilege needed); for a
daemon that serves emulated GPUs, through a local, unprivileged `EmulatedGPU` of the same
type that follows every write the daemon accepted (the daemon cannot see the work the job
emulates, so the job's own model counts its energy). A daemon GPU that is neither gets its energy
and power limit from the daemon and `GPUNotSupportedError` for the supported-clock list.

HTTP is stdlib `http.client` (the device layer takes no httpx dependency); errors become
the `GPUError` tree in one place, `_raise_for`, carrying the daemon's message.
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
    GPU,
    GPUError,
    GPUInitError,
    GPUNotSupportedError,
    GPUPermissionError,
    GPUValueError,
    StandIn,
    load_env_settings,
)
from zeus_power.device.emulated import EmulatedGPU

__all__ = ["ZeusdClient", "ZeusdGPU", "ZeusdSettings", "load_zeusd_settings", "open_zeusd_gpus"]

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
        assert s.host_port is not None
        match = _HOST_PORT.match(s.host_port)
        assert match is not None
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
                            "this user open its socket (see README, Running without root)?"
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


class ZeusdGPU(GPU):
    """A GPU whose writes go to the daemon and whose reads come from `reader` when given.

    Args:
        index: The CUDA-visible index this process knows the GPU by.
        client: The shared daemon connection.
        reader: Where reads come from: the same GPU through NVML, or an `EmulatedGPU`
            mirroring the daemon's emulated one (writes the daemon accepted are applied
            to it). None: energy and power limits are read from the daemon.
        name: The product name the daemon reported.
        daemon_index: The daemon's id of the GPU (zeusd numbers GPUs as NVML does, whatever
            `CUDA_VISIBLE_DEVICES` says); default `index`.
    """

    def __init__(
        self,
        index: int,
        client: ZeusdClient,
        reader: GPU | None,
        name: str,
        *,
        daemon_index: int | None = None,
    ) -> None:
        super().__init__(index)
        self.daemon_index = index if daemon_index is None else daemon_index
        self.client = client
        self.reader = reader
        self._name = name
        self._mirror = reader if isinstance(reader, EmulatedGPU) else None
        self._locked_mhz: int | None = None

    def _no_reader(self, what: str) -> GPUNotSupportedError:
        return GPUNotSupportedError(
            f"{what} is not in the zeusd API and NVML is not available in this process",
            gpu_index=self.index,
        )

    def name(self) -> str:
        return self._name

    def supported_memory_clocks_mhz(self) -> list[int]:
        if self.reader is None:
            raise self._no_reader("The list of memory clocks")
        return self.reader.supported_memory_clocks_mhz()

    def supported_sm_clocks_mhz(self, memory_clock_mhz: int | None = None) -> list[int]:
        if self.reader is None:
            raise self._no_reader("The list of SM clocks")
        return self.reader.supported_sm_clocks_mhz(memory_clock_mhz)

    def lock_sm_clocks(self, min_mhz: int, max_mhz: int) -> None:
        self.client.write(
            "set_gpu_locked_clocks",
            self.daemon_index,
            min_clock_mhz=int(min_mhz),
            max_clock_mhz=int(max_mhz),
        )
        # The daemon accepts supported clocks only, so the GPU now runs at max_mhz.
        self._locked_mhz = int(max_mhz)
        if self._mirror is not None:
            self._mirror.follow(self._locked_mhz, self._mirror.get_power_limit_mw())

    def reset_sm_clocks(self) -> None:
        self.client.write("reset_gpu_locked_clocks", self.daemon_index)
        self._locked_mhz = None
        if self._mirror is not None:
            self._mirror.follow(None, self._mirror.get_power_limit_mw())

    def current_sm_clock_mhz(self) -> int:
        if self.reader is None:
            raise self._no_reader("The current SM clock")
        return self.reader.current_sm_clock_mhz()

    def power_limit_constraints_mw(self) -> tuple[int, int]:
        if self.reader is not None:
            return self.reader.power_limit_constraints_mw()
        data = self.client.request(
            "GET", "/gpu/get_power_limit_constraints", {"gpu_ids": str(self.daemon_index)}
        )
        try:
            entry = data[str(self.daemon_index)]
            return int(entry["min_power_limit_mw"]), int(entry["max_power_limit_mw"])
        except (KeyError, TypeError, ValueError) as exc:
            raise GPUError(f"{self.client.where}: bad power-limit constraints {data!r}") from exc

    def default_power_limit_mw(self) -> int:
        if self.reader is None:
            raise self._no_reader("The default power limit")
        return self.reader.default_power_limit_mw()

    def get_power_limit_mw(self) -> int:
        if self.reader is not None:
            return self.reader.get_power_limit_mw()
        return self.client.read("get_power_limit", self.daemon_index, "power_limit_mw")

    def set_power_limit_mw(self, limit_mw: int) -> None:
        self.client.write("set_power_limit", self.daemon_index, power_limit_mw=int(limit_mw))
        if self._mirror is not None:
            self._mirror.follow(self._locked_mhz, int(limit_mw))

    def supports_energy_counter(self) -> bool:
        return True if self.reader is None else self.reader.supports_energy_counter()

    def total_energy_mj(self) -> int:
        if self.reader is not None:
            return self.reader.total_energy_mj()
        return self.client.read("get_cumulative_energy", self.daemon_index, "energy_mj")

    def power_usage_mw(self) -> int:
        if self.reader is not None:
            return self.reader.power_usage_mw()
        data = self.client.request("GET", "/gpu/get_power", {"gpu_ids": str(self.daemon_index)})
        try:
            return int(data["power_mw"][str(self.daemon_index)])
        except (KeyError, TypeError, ValueError) as exc:
            raise GPUError(f"{self.client.where}: bad power answer {data!r}") from exc

    @property
    def stand_in(self) -> StandIn | None:
        return None if self.reader is None else self.reader.stand_in

    @property
    def emulated(self) -> bool:
        return self.reader is not None and self.reader.emulated

    def __repr__(self) -> str:
        return f"ZeusdGPU(index={self.index}, {self.client.where})"


def open_zeusd_gpus(
    indices: list[int] | None,
    *,
    settings: ZeusdSettings | None = None,
    emulated: Any = None,
) -> list[GPU]:
    """Open GPUs served by the daemon; see the module docstring for where reads come from.

    Args:
        indices: CUDA-visible indices; None: every GPU the daemon lists.
        settings: Where the daemon is; default from `ZEUSD_*`.
        emulated: ``(index, GPUSpec) -> GPU`` making the local mirror of an emulated GPU.

    Raises:
        GPUInitError: No daemon address, daemon unreachable, a GPU it does not serve.
    """
    settings = load_zeusd_settings() if settings is None else settings
    client = ZeusdClient(settings)
    try:
        return _open(client, indices, emulated)
    except BaseException:
        client.close()
        raise


def _open(client: ZeusdClient, indices: list[int] | None, emulated: Any) -> list[GPU]:
    from zeus_power.device.specs import GPU_SPECS

    gpus = client.discover()["gpus"]
    names: dict[int, str] = {}
    for entry in gpus:
        try:
            names[int(entry["id"])] = str(entry.get("name", ""))[:200]
        except (KeyError, TypeError, ValueError) as exc:
            raise GPUInitError(
                f"{client.where}: /discover listed a GPU without an id: {entry!r}"
            ) from exc
    wanted = sorted(names) if indices is None else list(indices)
    emulated_specs = {f"{s.product_name} (emulated)": s for s in GPU_SPECS.values()}
    nvml: dict[int, GPU] = {}
    if not all(names.get(i, "") in emulated_specs for i in wanted):
        from zeus_power.device.nvml import open_nvml_gpus

        try:
            nvml = {g.index: g for g in open_nvml_gpus(wanted)}
        except GPUInitError:
            nvml = {}
    out: list[GPU] = []
    for index in wanted:
        reader = nvml.get(index)
        daemon_index = getattr(reader, "nvml_index", index)
        if daemon_index not in names:
            raise GPUInitError(
                f"{client.where} serves GPUs {sorted(names)}, not GPU {daemon_index}",
                gpu_index=index,
            )
        name = names[daemon_index]
        if name in emulated_specs and emulated is not None:
            reader = emulated(index, emulated_specs[name])
        out.append(ZeusdGPU(index, client, reader, name, daemon_index=daemon_index))
    return out
