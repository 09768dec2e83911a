"""The coordinator's Prometheus metrics (``GET /metrics``), one `CollectorRegistry` per app.

Coordinator-wide, counted as they happen: ``perseus_build_info{version,python}``,
``perseus_rounds_total``, ``perseus_round_latency_seconds`` (from a round's last request to
its schedules being ready: the scheduler's observe + plan and the dumps),
``perseus_http_requests_total{route,method,status}`` (`RequestCounter`, labelled by the
route's template, so a job id never becomes a label value here),
``perseus_jobs_ended_total{state}`` (finished, failed, evicted) and
``perseus_solve_failures_total{reason}`` (frontier solves that failed, their jobs held at
all-max: ``error``, ``memory``, ``crashed``, ``timeout``; `perseus.schedulers.perseus_scheduler.solve_pool`).

Read from the listed jobs at each scrape (`JobsCollector`): ``perseus_jobs{state}``,
``perseus_ranks``, and per job (label ``job_id``; Prometheus keeps ``job`` for the scrape
target) its state (``perseus_job_state{job_id,state}``, 1 for the current one), the
counters ``perseus_job_rounds_total``, ``perseus_job_iterations_total``,
``perseus_energy_joules_total`` (measured, every GPU, every reported iteration),
``perseus_energy_saved_joules_total`` and ``perseus_energy_overspent_joules_total`` (per
complete round against the job's measured all-max iteration, `perseus.server.job.stats`),
``perseus_guard_moves_total{job_id,reason}``, and the gauges of its latest figures: energy and
time per iteration (``which``: latest round, all-max, deployed), energy saving and slowdown
of its deployed plan (``source``: measured, predicted). A job that ends stays listed for
``PERSEUS_ENDED_JOB_TTL_S`` (default 600 s) and its series then disappear.

No ``_created`` series (`prometheus_client.disable_created_metrics`).
"""

from __future__ import annotations

import platform
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    Info,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from perseus.schedulers.perseus_scheduler.solve_pool import SolveFailedError
from perseus.server.job import CoordinatedJob
from perseus.server.job.barrier import JobPhase

if TYPE_CHECKING:
    from perseus.server.job_manager import JobManager

__all__ = ["JOB_LABEL", "CoordinatorMetrics", "JobsCollector", "RequestCounter", "package_version"]

JOB_LABEL = "job_id"
"""The label naming a job (``job`` is the scrape target's label in Prometheus)."""

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_ENDED_STATES = ("finished", "failed", "evicted")


def package_version() -> str:
    """The installed Perseus version (``0+unknown`` from a bare checkout)."""
    try:
        return version("perseus-energy")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0+unknown"


class CoordinatorMetrics:
    """The metrics of one coordinator app."""

    def __init__(self) -> None:
        disable_created_metrics()  # process-wide: no `_created` series on any counter
        self.registry = CollectorRegistry(auto_describe=True)
        Info(
            "perseus_build", "The Perseus build serving these metrics", registry=self.registry
        ).info({"version": package_version(), "python": platform.python_version()})
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
        self.jobs_ended = Counter(
            "perseus_jobs_ended",
            "Jobs that ended, by how: finished (closed normally), failed, evicted (idle)",
            ["state"],
            registry=self.registry,
        )
        for state in _ENDED_STATES:
            self.jobs_ended.labels(state)
        self.solve_failures = Counter(
            "perseus_solve_failures",
            "Frontier solves that failed (their jobs hold all-max), by why: error, memory, "
            "crashed (the process died), timeout",
            ["reason"],
            registry=self.registry,
        )
        for kind in SolveFailedError.KINDS:
            self.solve_failures.labels(kind)
        self._request_children: dict[tuple[str, str, int], Any] = {}
        self._jobs: JobsCollector | None = None

    def bind(self, manager: JobManager) -> None:
        """Report `manager`'s jobs at every scrape and count their rounds and ends."""
        if self._jobs is not None:
            self.registry.unregister(self._jobs)
        self._jobs = JobsCollector(manager)
        self.registry.register(self._jobs)
        manager.round_listeners.append(self.observe_round)
        manager.end_listeners.append(self.observe_end)

    def observe_round(self, job: CoordinatedJob, latency_s: float) -> None:
        self.rounds.inc()
        self.round_latency.observe(latency_s)
        for kind in job.stats.take_solve_failures():
            label = kind if kind in SolveFailedError.KINDS else "error"
            self.solve_failures.labels(label).inc()

    def observe_end(self, job: CoordinatedJob, state: str) -> None:
        self.jobs_ended.labels(state if state in _ENDED_STATES else "failed").inc()

    def count_request(self, route: str, method: str, status: int) -> None:
        key = (route, method, status)
        child = self._request_children.get(key)
        if child is None:
            child = self._request_children[key] = self.requests.labels(route, method, str(status))
        child.inc()


def _counter(name: str, documentation: str, *labels: str) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, labels=[JOB_LABEL, *labels])


def _gauge(name: str, documentation: str, *labels: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=[JOB_LABEL, *labels])


class JobsCollector(Collector):
    """Series read from the listed jobs at scrape time."""

    def __init__(self, manager: JobManager) -> None:
        self.manager = manager

    def collect(self) -> Iterator[Metric]:
        jobs = list(self.manager.jobs.values())
        by_state = GaugeMetricFamily("perseus_jobs", "Listed jobs by state", labels=["state"])
        for phase in JobPhase:
            by_state.add_metric([phase.value], sum(1 for j in jobs if j.phase is phase))
        yield by_state
        yield GaugeMetricFamily(
            "perseus_ranks",
            "Registered ranks, all listed jobs",
            value=sum(len(j.ranks) for j in jobs),
        )
        state = _gauge("perseus_job_state", "1 for the job's current state", "state")
        rounds = _counter("perseus_job_rounds", "Rounds handed out to the job")
        iterations = _counter(
            "perseus_job_iterations", "Iterations of the job's rounds that every rank reported"
        )
        energy_total = _counter(
            "perseus_energy_joules",
            "Energy measured by every GPU of the job over every reported iteration",
        )
        saved = _counter(
            "perseus_energy_saved_joules",
            "Energy saved against the job's measured all-max iteration, summed over its "
            "rounds that cost less (net saving: this minus perseus_energy_overspent_joules)",
        )
        overspent = _counter(
            "perseus_energy_overspent_joules",
            "Energy spent above the job's measured all-max iteration, summed over its rounds "
            "that cost more (profiling rounds, a plan that costs more)",
        )
        guard = _counter(
            "perseus_guard_moves",
            "Moves of the closed loop from the deployed plan (to a faster point or all-max), "
            "by reason",
            "reason",
        )
        energy = _gauge(
            "perseus_job_energy_per_iteration_joules",
            "Measured energy of one iteration, all GPUs of the job (which: latest round, "
            "all-max baseline, deployed plan)",
            "which",
        )
        time_s = _gauge(
            "perseus_job_time_per_iteration_seconds",
            "Measured iteration time (which: latest round, all-max baseline, deployed plan)",
            "which",
        )
        saving = _gauge(
            "perseus_job_energy_saving_ratio",
            "1 - E(deployed)/E(all-max) per iteration (source: measured or predicted)",
            "source",
        )
        slowdown = _gauge(
            "perseus_job_slowdown_ratio",
            "T(deployed)/T(all-max) - 1 per iteration (source: measured or predicted)",
            "source",
        )
        for job in jobs:
            job_id = job.job_id
            stats = job.stats
            for phase in JobPhase:
                state.add_metric([job_id, phase.value], 1.0 if job.phase is phase else 0.0)
            rounds.add_metric([job_id], stats.rounds_completed)
            iterations.add_metric([job_id], stats.iterations_measured)
            energy_total.add_metric([job_id], stats.energy_j_total)
            saved.add_metric([job_id], stats.energy_saved_j_total)
            overspent.add_metric([job_id], stats.energy_overspent_j_total)
            for reason, count in sorted(stats.guard_moves.items()):
                guard.add_metric([job_id, reason], count)
            measured = {"latest": stats.latest, **{k.value: m for k, m in stats.by_kind.items()}}
            for which, m in measured.items():
                if m is None or which == "other":
                    continue
                energy.add_metric([job_id, which], m.figures.energy_j)
                time_s.add_metric([job_id, which], m.figures.iteration_time_s)
            report = stats.report()
            for family, pairs in (
                (
                    saving,
                    (("measured", report.measured_saving), ("predicted", report.predicted_saving)),
                ),
                (
                    slowdown,
                    (
                        ("measured", report.measured_slowdown),
                        ("predicted", report.predicted_slowdown),
                    ),
                ),
            ):
                for source, value in pairs:
                    if value is not None:
                        family.add_metric([job_id, source], value)
        yield from (state, rounds, iterations, energy_total, saved, overspent, guard)
        yield from (energy, time_s, saving, slowdown)


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
