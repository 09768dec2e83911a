"""`create_app(settings)`: the batch-size optimizer's FastAPI application.

Nothing is built at import time. The lifespan builds the engine and the service, keeps
the service on `app.state` and disposes of the engine on shutdown. Domain errors become
HTTP statuses in one place (`zeus_power.bso.server.errors`); clients never see a traceback. With
``ZEUS_BSO_TOKEN`` every route but ``GET /health`` needs ``Authorization: Bearer <token>``
(401); bodies over ``ZEUS_BSO_MAX_BODY_BYTES`` are refused unread (413); both are
`zeus_power.serving` middlewares, shared with the Perseus coordinator.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from zeus_power.bso.db import make_engine
from zeus_power.bso.server.errors import install_error_handlers
from zeus_power.bso.server.routes import jobs, zeus
from zeus_power.bso.server.settings import BSOSettings
from zeus_power.bso.service import BSOService
from zeus_power.serving import BearerAuthMiddleware, BodyLimitMiddleware

__all__ = ["create_app"]


def create_app(settings: BSOSettings | None = None) -> FastAPI:
    """Build the server app; `settings` defaults to `BSOSettings()` (the environment)."""
    settings = settings if settings is not None else BSOSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        logging.getLogger("zeus_power.bso.server").setLevel(settings.log_level.upper())
        engine = make_engine(settings.db_url, sqlite_busy_timeout_s=settings.sqlite_busy_timeout_s)
        service = BSOService(engine, trial_timeout_s=settings.trial_timeout_s)
        service.create_tables()
        app.state.service = service
        try:
            yield
        finally:
            engine.dispose()

    app = FastAPI(title="Zeus batch-size optimizer", version="1", lifespan=lifespan)
    app.state.settings = settings
    app.include_router(jobs.router)
    app.include_router(zeus.router)  # Zeus 0.16's own clients, under /zeus
    install_error_handlers(app)

    @app.get("/health", tags=["health"])
    def health() -> dict[str, str]:
        return {"status": "ok"}

    # Outermost: the token (ZEUS_BSO_TOKEN), then the body's size; before any route runs.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(
        BearerAuthMiddleware,
        token=settings.token_value,
        open_paths=[("GET", "/health")],
        realm="zeus-bso",
    )
    return app
