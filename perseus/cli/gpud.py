"""`perseus gpud`: the minimal privileged GPU daemon (`zeus_power.gpud`) for sites without zeusd."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError

from perseus.cli._common import cli_errors
from perseus.errors import ConfigurationError

if TYPE_CHECKING:
    from zeus_power.gpud import GpudConfig

__all__ = ["gpud"]


def _permissions(value: str) -> int:
    """zeusd's ``--socket-permissions``: octal digits, e.g. 660."""
    if not value or len(value) > 4 or any(c not in "01234567" for c in value):
        raise typer.BadParameter(f"{value!r} is not an octal file mode such as 660")
    return int(value, 8)


def _read_token(path: Path) -> str:
    """The token file's text, stripped; refused when others may read it (the token's own
    rule is `GpudConfig`'s)."""
    from zeus_power.gpud.config import MAX_TOKEN_CHARS

    mode = path.stat().st_mode
    if mode & 0o004:
        raise typer.BadParameter(f"{path} is readable by every user; chmod 600 it")
    if path.stat().st_size > 2 * MAX_TOKEN_CHARS:
        raise typer.BadParameter(f"{path} is larger than a token; it must hold only the token")
    return path.read_text(encoding="utf-8", errors="replace").strip()


_FLAGS = {"token": "--token-file", "reap_interval_s": "--reap-interval"}


def _config(**values: Any) -> GpudConfig:
    """`GpudConfig`, its refusals as one message naming the flag (no pydantic dump)."""
    from zeus_power.gpud import GpudConfig

    try:
        return GpudConfig(**values)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            field = str(error["loc"][0]) if error["loc"] else ""
            flag = _FLAGS.get(field, "--" + field.removesuffix("_s").replace("_", "-"))
            message = str(error["msg"]).removeprefix("Value error, ")
            problems.append(f"{flag}: {message}" if field else message)
        raise ConfigurationError("; ".join(problems)) from None


@cli_errors
def gpud(
    socket_path: Annotated[
        str, typer.Option(help="[uds] Socket to listen on (zeusd's flag and default).")
    ] = "/var/run/zeusd.sock",
    backend: Annotated[
        str, typer.Option(help="nvml (real GPUs) or emulated (the DVFS emulator).")
    ] = "nvml",
    mode: Annotated[
        str, typer.Option(help="uds (Unix socket) or tcp (needs --token-file).")
    ] = "uds",
    socket_permissions: Annotated[
        str,
        typer.Option(help="[uds] Octal mode of the socket; 660 lets the socket's group in."),
    ] = "660",
    socket_uid: Annotated[
        int | None, typer.Option(help="[uds] chown the socket to this uid.")
    ] = None,
    socket_gid: Annotated[
        int | None, typer.Option(help="[uds] chgrp the socket to this gid (who may set clocks).")
    ] = None,
    tcp_bind_address: Annotated[str, typer.Option(help="[tcp] host:port.")] = "127.0.0.1:4938",
    token_file: Annotated[
        Path | None,
        typer.Option(help="File holding the bearer token clients must send (ZEUSD_TOKEN)."),
    ] = None,
    emulated_gpu: Annotated[
        str, typer.Option(help="[emulated] GPU type (A40, A100-SXM, H100-SXM).")
    ] = "A100-SXM",
    emulated_gpus: Annotated[
        int, typer.Option(min=1, max=64, help="[emulated] How many GPUs.")
    ] = 1,
    reap_interval: Annotated[
        float,
        typer.Option(min=0.01, max=60, help="Seconds between checks that clients still run."),
    ] = 0.5,
    max_connections: Annotated[
        int,
        typer.Option(
            min=1, max=1024, help="Connections served at once (a thread each); more get 503."
        ),
    ] = 64,
    request_timeout: Annotated[
        float,
        typer.Option(min=0.1, max=300, help="Seconds a started request and its answer may take."),
    ] = 10.0,
    idle_timeout: Annotated[
        float,
        typer.Option(min=1, max=3600, help="Seconds an idle keep-alive connection is kept."),
    ] = 60.0,
    allow_unprivileged: Annotated[
        bool, typer.Option(help="Run without root (the emulated backend never needs it).")
    ] = False,
    log_level: Annotated[str, typer.Option(help="Python log level.")] = "info",
) -> None:
    """Serve GPU clock and power-limit changes to unprivileged jobs (a zeusd API subset).

    Clients: ZEUS_GPU_BACKEND=zeusd with ZEUSD_SOCK_PATH (or ZEUSD_HOST_PORT and
    ZEUSD_TOKEN). Everything the daemon changed is reset when it exits or when the
    process that changed it is gone.
    """
    from zeus_power.gpud import run_gpud

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if mode not in ("uds", "tcp"):
        raise typer.BadParameter(f"--mode {mode!r}: use uds or tcp")
    if backend == "nvml" and os.geteuid() != 0 and not allow_unprivileged:
        raise typer.BadParameter(
            "--backend nvml needs root (or CAP_SYS_ADMIN) to set clocks; run it with sudo or "
            "as a systemd service, or pass --allow-unprivileged if capabilities are set"
        )
    config = _config(
        mode=mode,
        socket_path=socket_path,
        socket_permissions=_permissions(socket_permissions),
        socket_uid=socket_uid,
        socket_gid=socket_gid,
        tcp_bind_address=tcp_bind_address,
        token=_read_token(token_file) if token_file is not None else None,
        reap_interval_s=reap_interval,
        max_connections=max_connections,
        request_timeout_s=request_timeout,
        idle_timeout_s=idle_timeout,
    )
    run_gpud(config, backend=backend, emulated_gpu=emulated_gpu, emulated_gpus=emulated_gpus)
