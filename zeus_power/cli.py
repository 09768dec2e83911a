"""`perseus bso ...`: command line of the batch-size optimizer (a typer sub-app).

The lead mounts `app` as `perseus bso`; it also runs alone as
`python -m zeus_power.cli serve --port 8000`.
"""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = ["app"]

app = typer.Typer(
    name="bso",
    help="Zeus batch-size optimizer service.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _main() -> None:
    """Zeus batch-size optimizer service."""


@app.command(short_help="Serve the batch-size optimizer over HTTP.")
def serve(
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port.")] = 8000,
    db_url: Annotated[
        str | None,
        typer.Option(
            help="SQLAlchemy URL (default: ZEUS_BSO_DB_URL, else sqlite:///./zeus_bso.db); "
            "e.g. postgresql+psycopg://user:pw@host/db.",
        ),
    ] = None,
    log_level: Annotated[
        str | None, typer.Option(help="critical, error, warning, info or debug.")
    ] = None,
    trial_timeout: Annotated[
        float | None,
        typer.Option(
            help="Seconds after which an unreported trial counts as dead and its batch size "
            "is handed out again (default: ZEUS_BSO_TRIAL_TIMEOUT_S, else never).",
        ),
    ] = None,
    insecure: Annotated[
        bool,
        typer.Option(
            "--insecure",
            help="Listen on a non-loopback --host without a token (ZEUS_BSO_TOKEN).",
        ),
    ] = False,
) -> None:
    """Serve the batch-size optimizer over HTTP (a non-loopback --host needs ZEUS_BSO_TOKEN)."""
    import uvicorn
    from pydantic import ValidationError

    from zeus_power.bso.db import make_engine
    from zeus_power.bso.server import BSOSettings, create_app
    from zeus_power.bso.service import BSOService
    from zeus_power.errors import ZeusBSORuntimeError, ZeusConfigError
    from zeus_power.serving import header_timeout_protocol, install_accept_error_filter, is_loopback

    overrides: dict[str, str | float] = {}
    if db_url is not None:
        overrides["db_url"] = db_url
    if log_level is not None:
        overrides["log_level"] = log_level.lower()
    if trial_timeout is not None:
        overrides["trial_timeout_s"] = trial_timeout
    try:
        settings = BSOSettings(**overrides)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise typer.BadParameter(f"Invalid settings: {problems}") from None
    if settings.token is None and not is_loopback(host) and not insecure:
        raise typer.BadParameter(
            f"{host} is reachable from other machines and ZEUS_BSO_TOKEN is not set: set it "
            "(clients send the same ZEUS_BSO_TOKEN), or pass --insecure",
            param_hint="--host",
        )
    # Fail here, with a usage error, rather than with a traceback in the server's startup:
    # a bad URL, an unreachable server, a path that cannot be created, a file that is not
    # a database. Creating the tables is idempotent; the server's startup does it again.
    try:
        engine = make_engine(settings.db_url)
        try:
            BSOService(engine).create_tables()
        finally:
            engine.dispose()
    except (ZeusConfigError, ZeusBSORuntimeError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--db-url") from exc
    install_accept_error_filter()
    uvicorn.run(
        create_app(settings),
        host=host,
        port=port,
        log_level=settings.log_level,
        http=header_timeout_protocol(settings.header_timeout_s),
    )


if __name__ == "__main__":
    app()
