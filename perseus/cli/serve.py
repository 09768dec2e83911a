"""`perseus serve`: run the coordinator (settings from the ``PERSEUS_*`` environment; the
scheduler and its arguments also as flags, generated from the schedulers' argument models:
`perseus.cli.scheduler_flags`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any

import typer

from perseus.cli._common import cli_errors, console

__all__ = ["serve"]


def _load_settings(sources: dict[str, str] | None = None, **overrides: Any):  # type: ignore[no-untyped-def]
    """The ``PERSEUS_*`` settings; a `ConfigurationError` naming what is wrong (never the
    value: it may be the token). `sources`: the option each override came from."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from perseus.errors import ConfigurationError
    from perseus.settings import PerseusSettings

    sources = sources or {}
    try:
        return PerseusSettings(**overrides)
    except ValidationError as exc:
        problems = "; ".join(
            f"{sources.get(str(err['loc'][0]) if err['loc'] else '', _variable(err['loc']))}: "
            f"{str(err['msg']).removeprefix('Value error, ')}"
            for err in exc.errors()
        )
        raise ConfigurationError(f"invalid settings: {problems}") from None
    except SettingsError as exc:
        cause = exc.__cause__
        if "scheduler_args" in str(exc):
            raise ConfigurationError(
                "PERSEUS_SCHEDULER_ARGS is not a JSON object"
                + (f" ({cause})" if cause else "")
                + ", e.g. PERSEUS_SCHEDULER_ARGS='{\"max_slowdown\": 0.01}' (or the flags: "
                "perseus serve --help)"
            ) from None
        raise ConfigurationError(f"invalid PERSEUS_* settings: {exc}") from None


def _variable(loc: tuple[Any, ...]) -> str:
    return "PERSEUS_" + ".".join(str(p) for p in loc).upper() if loc else "PERSEUS_*"


def _read_token_file(path: Path, option: str) -> str:
    """A token from a file, checked here so that a bad one is named by its option."""
    from perseus.errors import ConfigurationError
    from zeus_power.bearer import check_bearer_token

    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(
            f"{option} {path}: cannot read it ({type(exc).__name__})"
        ) from None
    try:
        token = check_bearer_token(text)
    except ValueError as exc:
        raise ConfigurationError(f"{option} {path}: {exc}") from None
    if token is None:
        raise ConfigurationError(f"{option} {path}: the file is empty")
    return token


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
    metrics_token_file: Annotated[
        Path | None,
        typer.Option(
            "--metrics-token-file",
            help="Read a read-only token for GET /metrics from this file instead of "
            "PERSEUS_METRICS_TOKEN (a Prometheus scrape config holds it, not the token).",
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
    scheduler: Annotated[
        str | None,
        typer.Option(
            "--scheduler",
            help="The scheduler: Perseus, AllMaxFrequency, PointSolution, "
            "InstructionProfiler, EnvPipe, ZeusGlobal, ZeusPerStage, or a plugin as "
            "package.module:Class (default: PERSEUS_SCHEDULER, else Perseus). Its arguments "
            "are the flags below, or PERSEUS_SCHEDULER_ARGS (JSON); flags win.",
        ),
    ] = None,
    *,
    scheduler_flags: dict[str, Any] | None = None,
) -> None:
    """Run the Perseus coordinator.

    The scheduler's arguments are flags (each names the schedulers that take it) or
    PERSEUS_SCHEDULER_ARGS as JSON; flags win. Other settings: the PERSEUS_* variables
    (docs/operating.md, "Deploy on a cluster").
    """
    import uvicorn

    from perseus.cli.scheduler_flags import scheduler_args
    from perseus.errors import ConfigurationError
    from perseus.schedulers.registry import resolve_scheduler
    from perseus.server import create_app
    from zeus_power.serving import header_timeout_protocol, install_accept_error_filter, is_loopback

    overrides: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if token_file is not None:
        overrides["token"] = _read_token_file(token_file, "--token-file")
        sources["token"] = "--token-file"
    if metrics_token_file is not None:
        overrides["metrics_token"] = _read_token_file(metrics_token_file, "--metrics-token-file")
        sources["metrics_token"] = "--metrics-token-file"
    settings = _load_settings(sources, **overrides)
    name = scheduler.strip() if scheduler is not None else settings.scheduler
    if not name:
        raise ConfigurationError("--scheduler must name a scheduler, e.g. Perseus")
    cls = resolve_scheduler(name)
    if isinstance(getattr(cls, "Args", None), type):  # else create_app says what is wrong
        args = scheduler_args(name, cls.Args, settings.scheduler_args, scheduler_flags or {})
        settings = _load_settings(sources, **overrides, scheduler=name, scheduler_args=args)
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
