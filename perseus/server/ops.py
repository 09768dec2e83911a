"""The operator's routes: ``GET /healthz``, ``GET /metrics``, ``GET /jobs``, ``GET /jobs/{job_id}``.

``/healthz`` is cheap (no job is walked) and needs no credentials; ``/metrics`` is the
Prometheus text format (`perseus.server.metrics`); ``/jobs`` lists the live jobs and
``/jobs/{job_id}`` adds the deployed plan's summary and the job's energy report
(`perseus.planning.report`: measured energy and time per iteration under the all-max
baseline and the deployed plan, and the plan's predictions).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field

from perseus.domain.plan import Plan
from perseus.planning.report import EnergyReport, IterationFigures, RoundKind
from perseus.server.errors import error_responses
from perseus.server.job import CoordinatedJob
from perseus.server.job_manager import JobManager
from perseus.server.metrics import CoordinatorMetrics
from perseus.server.routes import JobManagerDep

__all__ = [
    "HEALTHZ_URL",
    "JOBS_URL",
    "JOB_URL",
    "METRICS_URL",
    "Health",
    "JobDetail",
    "JobSummary",
    "MeasuredRoundView",
    "PlanSummary",
    "router",
]

HEALTHZ_URL = "/healthz"
METRICS_URL = "/metrics"
JOBS_URL = "/jobs"
JOB_URL = "/jobs/{job_id}"


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    jobs: int = Field(description="live jobs")


class PlanSummary(BaseModel):
    """The deployed plan, in brief (its predicted numbers are for one pipeline)."""

    schedule: str
    num_stages: int
    num_microbatches: int
    num_chunks: int
    instructions: int
    min_frequency_mhz: int
    max_frequency_mhz: int
    mean_frequency_mhz: float
    iteration_time_s: float
    energy_j: float = Field(description="predicted, one pipeline, J per iteration")

    @classmethod
    def of(cls, plan: Plan) -> PlanSummary:
        freqs = [f for stage in plan.stage_frequencies() for f in stage]
        return cls(
            schedule=plan.schedule,
            num_stages=plan.num_stages,
            num_microbatches=plan.num_microbatches,
            num_chunks=plan.num_chunks,
            instructions=len(freqs),
            min_frequency_mhz=min(freqs, default=0),
            max_frequency_mhz=max(freqs, default=0),
            mean_frequency_mhz=sum(freqs) / len(freqs) if freqs else 0.0,
            iteration_time_s=plan.iteration_time,
            energy_j=plan.energy,
        )


class MeasuredRoundView(BaseModel):
    round: int = Field(description="the round whose schedules these results ran")
    kind: RoundKind
    figures: IterationFigures


class JobSummary(BaseModel):
    job_id: str
    state: str
    scheduler: str
    world_size: int
    talking_ranks: int = Field(
        description="ranks that register, report and ask for schedules: the job's leaders "
        "(protocol 2) or every rank (protocol 1)"
    )
    ranks_registered: int
    round: int = Field(description="the round being gathered now")
    rounds_completed: int = Field(description="rounds handed out by this coordinator")


class JobDetail(JobSummary):
    pp_degree: int
    dp_degree: int
    tp_degree: int
    failure: str | None
    last_round_latency_s: float | None
    deployed_plan: PlanSummary | None
    latest_measured: MeasuredRoundView | None
    energy: EnergyReport
    promise: list[dict[str, Any]] = Field(
        default_factory=list,
        description="the scheduler's deployments, guard checks and moves, each with its round, "
        "event, reason and figures (newest last)",
    )


def _summary(job: CoordinatedJob) -> dict[str, object]:
    return {
        "job_id": job.job_id,
        "state": job.phase.value,
        "scheduler": job.scheduler_cls.__name__,
        "world_size": job.info.world_size,
        "talking_ranks": job.talking_ranks,
        "ranks_registered": len(job.ranks),
        "round": job.round.number,
        "rounds_completed": job.stats.rounds_completed,
    }


def job_detail(job: CoordinatedJob) -> JobDetail:
    stats = job.stats
    latest = stats.latest
    return JobDetail(
        **_summary(job),  # type: ignore[arg-type]
        pp_degree=job.info.pp_degree,
        dp_degree=job.info.dp_degree,
        tp_degree=job.info.tp_degree,
        failure=str(job.failure) if job.failure is not None else None,
        last_round_latency_s=stats.last_round_latency_s,
        deployed_plan=PlanSummary.of(stats.plan) if stats.plan is not None else None,
        latest_measured=(
            MeasuredRoundView(round=latest.number, kind=latest.kind, figures=latest.figures)
            if latest is not None
            else None
        ),
        energy=stats.report(),
        promise=list(stats.promise),
    )


async def _metrics(request: Request) -> CoordinatorMetrics:
    return request.app.state.metrics  # type: ignore[no-any-return]


router = APIRouter(tags=["operator"])


@router.get(HEALTHZ_URL)
async def healthz(request: Request) -> Health:
    """Liveness: 200 while the coordinator serves (no credentials needed)."""
    manager: JobManager | None = getattr(request.app.state, "job_manager", None)
    return Health(jobs=len(manager.jobs) if manager is not None else 0)


@router.get(
    METRICS_URL,
    response_class=Response,
    responses={
        200: {
            "content": {"text/plain": {"schema": {"type": "string"}}},
            "description": "Prometheus text exposition format",
        },
        **error_responses(401),
    },
)
async def metrics(metrics: Annotated[CoordinatorMetrics, Depends(_metrics)]) -> Response:
    """Prometheus metrics (text exposition format)."""
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.get(JOBS_URL, responses=error_responses(401))
async def list_jobs(manager: JobManagerDep) -> list[JobSummary]:
    """Every live job: state, scheduler, ranks and round."""
    return [JobSummary(**_summary(job)) for job in manager.jobs.values()]  # type: ignore[arg-type]


@router.get(JOB_URL, responses=error_responses(401, 404))
async def get_job(job_id: str, manager: JobManagerDep) -> JobDetail:
    """One job: its summary, deployed plan, and measured vs predicted energy report."""
    return job_detail(manager.get(job_id))
