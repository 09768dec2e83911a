"""The coordinator's Prometheus metrics (``GET /metrics``), one `CollectorRegistry` per app.

Counted as they happen: ``perseus_rounds_total``, ``perseus_round_latency_seconds`` (from a
round's last request to its schedules being ready: the scheduler's observe + plan and the
dumps), ``perseus_http_requests_total{route,method,status}`` (`RequestCounter`, labelled by
the route's template, so a job id never becomes a label value here). Read from the live
jobs at each scrape (`JobsCollector`): jobs by state, registered ranks, and per job its
round, its measured energy and time per iteration (latest round, all-max, deployed) and the
measured and predicted energy saving of its deployed plan.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from perseus.server.job import CoordinatedJob, JobPhase

if TYPE_CHECKING:
    from perseus.server.job_manager import JobManager

__all__ = ["CoordinatorMetrics", "JobsCollector", "RequestCounter"]

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class CoordinatorMetrics:
    """The metrics of one coordinator app."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.rounds = Counter(
            "perseus_rounds",
            "Scheduling rounds handed out, all jobs",
            registry=self.registry,
        )
        self.round_latency = Histogram(
            "perseus_round_latency_seconds",
            "From a round's last schedule request to its schedules being ready",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.requests = Counter(
            "perseus_http_requests",
            "HTTP requests answered, by route template, method and status",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self._request_children: dict[tuple[str, str, int], Any] = {}
        self._jobs: JobsCollector | None = None

    def bind(self, manager: JobManager) -> None:
        """Report `manager`'s jobs at every scrape and count their rounds."""
        if self._jobs is not None:
            self.registry.unregister(self._jobs)
        self._jobs = JobsCollector(manager)
        self.registry.register(self._jobs)
        manager.round_listeners.append(self.observe_round)

    def observe_round(self, job: CoordinatedJob, latency_s: float) -> None:
        self.rounds.inc()
        self.round_latency.observe(latency_s)

    def count_request(self, route: str, method: str, status: int) -> None:
        key = (route, method, status)
        child = self._request_children.get(key)
        if child is None:
            child = self._request_children[key] = self.requests.labels(route, method, str(status))
        child.inc()


class JobsCollector(Collector):
    """Gauges read from the live jobs at scrape time."""

    def __init__(self, manager: JobManager) -> None:
        self.manager = manager

    def collect(self) -> Iterator[Metric]:
        jobs = list(self.manager.jobs.values())
        by_state = GaugeMetricFamily("perseus_jobs", "Live jobs by state", labels=["state"])
        for phase in JobPhase:
            by_state.add_metric([phase.value], sum(1 for j in jobs if j.phase is phase))
        yield by_state
        yield GaugeMetricFamily(
            "perseus_ranks",
            "Registered ranks, all live jobs",
            value=sum(len(j.ranks) for j in jobs),
        )
        round_no = GaugeMetricFamily(
            "perseus_job_rounds", "Rounds handed out to the job", labels=["job_id"]
        )
        energy = GaugeMetricFamily(
            "perseus_job_energy_per_iteration_joules",
            "Measured energy of one iteration, all GPUs of the job (which: latest round, "
            "all-max baseline, deployed plan)",
            labels=["job_id", "which"],
        )
        time_s = GaugeMetricFamily(
            "perseus_job_time_per_iteration_seconds",
            "Measured iteration time (which: latest round, all-max baseline, deployed plan)",
            labels=["job_id", "which"],
        )
        saving = GaugeMetricFamily(
            "perseus_job_energy_saving_ratio",
            "1 - E(deployed)/E(all-max) per iteration (source: measured or predicted)",
            labels=["job_id", "source"],
        )
        for job in jobs:
            stats = job.stats
            round_no.add_metric([job.job_id], stats.rounds_completed)
            measured = {"latest": stats.latest, **{k.value: m for k, m in stats.by_kind.items()}}
            for which, m in measured.items():
                if m is None or which == "other":
                    continue
                energy.add_metric([job.job_id, which], m.figures.energy_j)
                time_s.add_metric([job.job_id, which], m.figures.iteration_time_s)
            report = stats.report()
            for source, value in (
                ("measured", report.measured_saving),
                ("predicted", report.predicted_saving),
            ):
                if value is not None:
                    saving.add_metric([job.job_id, source], value)
        yield from (round_no, energy, time_s, saving)


class RequestCounter:
    """Pure ASGI middleware counting answered HTTP requests by route template and status."""

    def __init__(self, app: Any, metrics: CoordinatorMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_counting(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_counting)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "<unmatched>"
            method = scope.get("method", "")
            self.metrics.count_request(template, method if method in _METHODS else "OTHER", status)
