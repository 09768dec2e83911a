"""`AllMaxFrequency`: every instruction at the highest SM frequency (the baseline)."""

from __future__ import annotations

from perseus.protocol import JobInfo, RankInfo
from perseus.schedulers.args import PipelineArgs
from perseus.schedulers.pipeline import FixedPlanScheduler
from perseus.settings import PerseusSettings

__all__ = ["AllMaxFrequency"]


class AllMaxFrequency(FixedPlanScheduler):
    """Run every instruction of every rank at the highest frequency all GPUs support.

    Args (``PERSEUS_SCHEDULER_ARGS``):
        num_microbatches: Microbatches per iteration (sets the length of each schedule).
        schedule: The pipeline schedule, ``"1f1b"`` (default) or ``"gpipe"``.

    Results are accepted and ignored, so clients need not report breakdowns.
    """

    needs_breakdowns = None

    def __init__(
        self,
        job_info: JobInfo,
        rank_infos: list[RankInfo],
        perseus_settings: PerseusSettings,
        args: PipelineArgs,
    ) -> None:
        super().__init__(job_info, rank_infos, perseus_settings, args)
        self.fixed_plan = self.max_plan()
