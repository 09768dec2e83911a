"""`perseus serve`: run the coordinator (settings from the ``PERSEUS_*`` environment)."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from perseus.cli._common import cli_errors, console

__all__ = ["serve"]


def _load_settings():  # type: ignore[no-untyped-def]
    """The ``PERSEUS_*`` settings; a `ConfigurationError` naming what is wrong."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from perseus.errors import ConfigurationError
    from perseus.settings import PerseusSettings

    try:
        return PerseusSettings()
    except (ValidationError, SettingsError) as exc:
        raise ConfigurationError(f"invalid PERSEUS_* settings: {exc}") from None


@cli_errors
def serve(
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
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
) -> None:
    """Run the Perseus coordinator. Scheduler: PERSEUS_SCHEDULER, PERSEUS_SCHEDULER_ARGS (JSON)."""
    import uvicorn

    from perseus.server import create_app

    settings = _load_settings()
    app = create_app(settings, round_timeout_s=round_timeout_s)
    level = (log_level or settings.log_level).lower()
    logging.basicConfig(
        level="DEBUG" if level == "trace" else level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    console.print(
        f"Perseus coordinator on http://{host}:{port} — scheduler [bold]{settings.scheduler_name}"
        f"[/] {settings.scheduler_args or ''}"
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
        # Long-polling ranks must not hold up a shutdown: they get 503 when it ends.
        timeout_graceful_shutdown=3,
    )
