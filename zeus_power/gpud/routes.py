"""The zeusd-subset API: query parsing and routing, in zeusd 0.5's answers and error shapes.

Pure functions of the GPU state and the request's method, path and query: the connection
plumbing (bodies, auth, timeouts) is `zeus_power.gpud.handler`'s. Shapes: per-GPU failures
``{"errors": {"<id>": msg}}``, query problems ``{"error": msg}`` or actix's plain-text
``Query deserialize error``, an unknown GPU on a write zeusd's plain ``GPU index N does not
exist.``
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from zeus_power.device import (
    GPU,
    GPUError,
    GPUNotSupportedError,
    GPUPermissionError,
    GPUValueError,
)
from zeus_power.errors import ZeusError
from zeus_power.gpud.peers import Peer
from zeus_power.gpud.state import GpuState, StoppingError

__all__ = ["API_GROUPS", "RequestError", "discovery", "route"]

API_GROUPS = ("gpu-control", "gpu-read")
U32_MAX = 2**32 - 1


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
    """zeusd's status for an NVML error: bad value/unsupported 400, no permission 403; a
    write while the daemon stops 503."""
    if isinstance(exc, StoppingError):
        return 503
    if isinstance(exc, GPUValueError | GPUNotSupportedError):
        return 400
    if isinstance(exc, GPUPermissionError):
        return 403
    return 500


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


def discovery(state: GpuState, *, auth_required: bool) -> dict[str, Any]:
    """``GET /discover``: the GPUs, the API groups served, whether a token is needed."""
    return {
        "gpus": [
            {
                "id": index,
                "name": slot.gpu.name(),
                "cumulative_energy_available": slot.gpu.supports_energy_counter(),
            }
            for index, slot in sorted(state.slots.items())
        ],
        "cpus": [],
        "enabled_api_groups": list(API_GROUPS),
        "auth_required": auth_required,
    }


def route(
    state: GpuState,
    method: str,
    path: str,
    query: dict[str, str],
    n: int,
    *,
    peer: Peer | None,
    auth_required: bool,
) -> tuple[int, Any]:
    """The status and JSON body of one request (`n`: the query's fields, repeats counted);
    a refused request raises `RequestError`."""
    known = sorted(state.slots)
    if path == "/discover" and method == "GET":
        return 200, discovery(state, auth_required=auth_required)
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
        refused = state.write(path.removeprefix("/gpu/"), ids, params, peer)
        if refused:
            worst = max(_gpu_status(e) for e in refused.values())
            return worst, {"errors": {str(i): str(e) for i, e in refused.items()}}
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
