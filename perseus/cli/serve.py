"""`perseus serve`: run the coordinator (settings from the ``PERSEUS_*`` environment)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any

import typer

from perseus.cli._common import cli_errors, console

__all__ = ["serve"]


def _load_settings(**overrides: Any):  # type: ignore[no-untyped-def]
    """The ``PERSEUS_*`` settings; a `ConfigurationError` naming what is wrong (never the
    value: it may be the token)."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from perseus.errors import ConfigurationError
    from perseus.settings import PerseusSettings

    try:
        return PerseusSettings(**overrides)
    except ValidationError as exc:
        problems = "; ".join(
            f"PERSEUS_{'.'.join(str(p) for p in err['loc']).upper()}: {err['msg']}"
            for err in exc.errors()
        )
        raise ConfigurationError(f"invalid PERSEUS_* settings: {problems}") from None
    except SettingsError as exc:
        raise ConfigurationError(f"invalid PERSEUS_* settings: {exc}") from None


def _read_token_file(path: Path) -> str:
    from perseus.errors import ConfigurationError

    try:
        return path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(
            f"--token-file {path}: cannot read it ({type(exc).__name__})"
        ) from None


@cli_errors
def serve(
    host: Annotated[
        str,
        typer.Option(
            help="Interface to listen on. Anything but loopback needs a token "
            "(PERSEUS_TOKEN or --token-file) or --insecure."
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 7787,
    log_level: Annotated[
        str | None,
        typer.Option(help="uvicorn/Perseus log level (default: PERSEUS_LOG_LEVEL or info)."),
    ] = None,
    round_timeout_s: Annotated[
        float,
        typer.Option(
            "--round-timeout",
            envvar="PERSEUS_ROUND_TIMEOUT_S",
            help="Seconds a round waits for every rank to ask before failing the job (504).",
        ),
    ] = 120.0,
    keep_alive_s: Annotated[
        float,
        typer.Option(
            "--keep-alive",
            help="Seconds an idle client connection stays open (ranks talk once per round).",
        ),
    ] = 600.0,
    token_file: Annotated[
        Path | None,
        typer.Option(
            "--token-file",
            help="Read the token every client must send (Authorization: Bearer) from this "
            "file instead of PERSEUS_TOKEN.",
        ),
    ] = None,
    insecure: Annotated[
        bool,
        typer.Option(
            "--insecure",
            help="Listen on a non-loopback --host without a token (anyone who reaches the "
            "port can then drive every job's GPU clocks).",
        ),
    ] = False,
) -> None:
    """Run the Perseus coordinator. Scheduler: PERSEUS_SCHEDULER, PERSEUS_SCHEDULER_ARGS (JSON)."""
    import uvicorn

    from perseus.errors import ConfigurationError
    from perseus.server import create_app
    from zeus_power.serving import header_timeout_protocol, install_accept_error_filter, is_loopback

    overrides = {"token": _read_token_file(token_file)} if token_file is not None else {}
    settings = _load_settings(**overrides)
    if settings.token is None and not is_loopback(host) and not insecure:
        raise ConfigurationError(
            f"--host {host} is reachable from other machines and no token is set: set "
            "PERSEUS_TOKEN or --token-file (clients send the same PERSEUS_TOKEN), or pass "
            "--insecure to serve without authentication"
        )
    app = create_app(settings, round_timeout_s=round_timeout_s)
    level = (log_level or settings.log_level).lower()
    logging.basicConfig(
        level="DEBUG" if level == "trace" else level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    install_accept_error_filter()
    auth = "token required" if settings.token is not None else "NO authentication"
    console.print(
        f"Perseus coordinator on http://{host}:{port} ({auth}) — scheduler "
        f"[bold]{settings.scheduler_name}[/] {sorted(settings.scheduler_args) or ''}"
        + (f", dumping to {settings.dump_dir}" if settings.dump_data else ""),
        highlight=False,
        soft_wrap=True,
    )
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level=level,
        timeout_keep_alive=int(keep_alive_s),
        http=header_timeout_protocol(settings.header_timeout_s),
        # Long-polling ranks must not hold up a shutdown: they get 503 when it ends.
        timeout_graceful_shutdown=3,
    )
