"""The Perseus coordinator: a FastAPI app that drives every job's frequency scheduler.

Build it with `create_app` (nothing is built at import time)::

    uvicorn --factory perseus.server:create_app          # settings from PERSEUS_* env
    python -m perseus.server --port 7787                   # the same, with options
    perseus serve --port 7787

Routes (`perseus.server.routes`): ``GET /info``, ``POST /register_job`` → job id,
``POST /register_rank/{job_id}``, ``GET /schedule/{job_id}?rank=R`` (the round barrier),
``POST /result/{job_id}``, ``POST /straggler/{job_id}``, ``POST /finish/{job_id}`` (rank 0,
once every rank closed: the job is ``finished``); the operator's view
(`perseus.server.ops`): ``GET /healthz``, ``GET /metrics`` (Prometheus), ``GET /jobs``,
``GET /jobs/{job_id}``. Job state and the barrier:
`perseus.server.job_manager`, `perseus.server.job`. Status codes: `perseus.server.errors`.

With `dump_data`, each job's ``job.json``, ``scheduler.json``, ``ranks.json``,
``N.sched.json``, ``N.prof.json`` and ``deployed_plan.json`` are written under
``dump_dir/<job_id>/`` (`perseus.io.jobdir.JobDir` names them), and a coordinator started
on the same `dump_dir` restores the live ones before it accepts a connection (their ranks,
retrying meanwhile, get the deployed plan again); failed and evicted jobs stay down, and a
dump it cannot trust is refused with a warning (`perseus.server.job_manager`). Jobs idle
longer than `max_job_idle_time` are evicted by a background task; jobs that ended (failed,
finished) are forgotten `ended_job_ttl_s` after they ended.

With `PerseusSettings.token`, every request but ``GET /healthz`` needs the operator's token
or, under a job id, the job's credential; ``GET /metrics`` also takes the read-only
`PerseusSettings.metrics_token` (`perseus.server.auth`); bodies over
`max_body_bytes` are refused unread (413), as are jobs over `max_world_size` ranks (422)
and jobs beyond `max_jobs` (503).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI

from perseus.errors import ConfigurationError
from perseus.schedulers.base import check_scheduler_args
from perseus.schedulers.registry import resolve_scheduler
from perseus.server.auth import CoordinatorAuthMiddleware
from perseus.server.errors import install_error_handlers
from perseus.server.job_manager import JobManager
from perseus.server.metrics import CoordinatorMetrics, RequestCounter
from perseus.server.ops import router as ops_router
from perseus.server.routes import router
from perseus.settings import PerseusSettings
from zeus_power.serving import BodyLimitMiddleware

__all__ = ["DEFAULT_ROUND_TIMEOUT_S", "create_app"]

logger = logging.getLogger(__name__)

DEFAULT_ROUND_TIMEOUT_S = 120.0


async def _evict_forever(manager: JobManager, period_s: float) -> None:
    while True:
        await asyncio.sleep(period_s)
        manager.evict_idle()


def create_app(
    settings: PerseusSettings | None = None, *, round_timeout_s: float = DEFAULT_ROUND_TIMEOUT_S
) -> FastAPI:
    """Build the coordinator app.

    Args:
        settings: Coordinator settings; default: read from the ``PERSEUS_*`` environment.
        round_timeout_s: How long a round's barrier waits, from its first request, for every
            rank to ask before all waiting ranks get 504 and the job fails.

    Raises:
        ConfigurationError: The scheduler's name or arguments are invalid (checked up front:
            `settings.scheduler` is resolved here, through `perseus.schedulers.registry`).
    """
    settings = settings if settings is not None else PerseusSettings()
    scheduler_cls = resolve_scheduler(settings.scheduler)
    check_scheduler_args(scheduler_cls, settings.scheduler_args)
    if not round_timeout_s > 0:
        raise ConfigurationError(f"round_timeout_s must be positive, got {round_timeout_s!r}")

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        manager = JobManager(settings, scheduler_cls, round_timeout_s=round_timeout_s)
        app.state.job_manager = manager
        metrics.bind(manager)
        await manager.reload()
        period = min(60.0, settings.max_job_idle_time / 2)
        evictor = asyncio.create_task(_evict_forever(manager, period))
        try:
            yield
        finally:
            evictor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await evictor
            await manager.close()

    app = FastAPI(
        title="Perseus coordinator",
        summary=f"Frequency scheduling with {scheduler_cls.__name__}",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.scheduler_cls = scheduler_cls
    app.state.round_timeout_s = round_timeout_s
    metrics = CoordinatorMetrics()
    app.state.metrics = metrics
    app.include_router(router)
    app.include_router(ops_router)
    app.add_middleware(RequestCounter, metrics=metrics)
    install_error_handlers(app)
    # Outermost first: the credentials, then the body's size; both before a body is read
    # or a route runs (see perseus.server.auth).
    token = settings.token_value
    if token is None and settings.metrics_token is not None:
        logger.warning(
            "PERSEUS_METRICS_TOKEN is set but PERSEUS_TOKEN is not: this coordinator asks "
            "for no credential at all, /metrics included"
        )
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(
        CoordinatorAuthMiddleware,
        state=app.state,
        token=token,
        metrics_token=settings.metrics_token_value,
    )
    return app
