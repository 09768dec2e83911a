"""The scheduler interface the coordinator drives.

One instance per job. The coordinator calls `next_schedule()` when every rank of the job
has asked for its next schedule (a round), and `observe()` with the round's results.
"""

from __future__ import annotations

import abc

from perseus.models import FrequencySchedule, JobInfo, PerseusSettings, ProfilingResult, RankInfo

__all__ = ["FrequencyScheduler"]


class FrequencyScheduler(abc.ABC):
    """Base class of frequency schedulers."""

    def __init__(
        self, job_info: JobInfo, rank_infos: list[RankInfo], perseus_settings: PerseusSettings
    ) -> None:
        self.job_info = job_info
        self.rank_infos = sorted(rank_infos, key=lambda r: r.rank)
        self.settings = perseus_settings

    @abc.abstractmethod
    def next_schedule(self) -> list[FrequencySchedule]:
        """The next round's schedule for every rank of the job (one per rank)."""

    @abc.abstractmethod
    def observe(self, profiling_results: list[ProfilingResult]) -> None:
        """Ingest the results of the last round (one per rank)."""
