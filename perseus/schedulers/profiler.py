"""`InstructionProfiler`: profile every instruction at every frequency, online."""

from __future__ import annotations

from perseus.protocol import JobInfo, ProfilingResult, RankInfo
from perseus.schedulers.args import PipelineArgs, SweepArgs
from perseus.schedulers.pipeline import PipelineScheduler, RoundMeasurement, StagePlan
from perseus.schedulers.sweep.instruction_sweep import InstructionSweep, SweepPhase
from perseus.settings import PerseusSettings

__all__ = ["InstructionProfiler", "ProfilerArgs"]


class ProfilerArgs(PipelineArgs, SweepArgs):
    """`InstructionProfiler`'s arguments: the pipeline and the sweep."""


class InstructionProfiler(PipelineScheduler):
    """Sweep SM frequencies high → low over rounds, then keep the job at max frequency.

    Each coarse or full sweep round runs every still-active (stage, instruction) at one
    frequency (each at its own during the coarse sweep's refinement), for
    every pipeline (virtual) stage and every kind the job's schedule runs (forward,
    backward, or a split backward's backward_input and backward_weight); the
    per-instruction numbers are the mean over the window's iterations and occurrences,
    aggregated per stage (time = max over the stage's ranks, energy = sum over the stage's
    tp ranks of the first dp pipeline; see `perseus.schedulers.parallel`). Early stop and warm-up:
    `perseus.schedulers.sweep.instruction_sweep`. When the sweep is done the `InstructionProfilingResult` (long-form
    CSV, one row group per pipeline stage, its `stage` column the virtual stage) is
    written to ``dump_dir/<job_id>/instruction_profile.csv``
    (whether or not `dump_data` is on: the profile is a product) and every later round runs
    at max frequency. A job restored by a restarted coordinator whose profile file exists
    runs at max frequency straight away.

    Args (``PERSEUS_SCHEDULER_ARGS``):
        num_microbatches: Microbatches per iteration of jobs that do not describe their
            pipeline (None: every job must).
        schedule: Their pipeline schedule (default ``"1f1b"``).
        warmup_rounds: Rounds at max frequency before measuring (default 1).
        freq_step: Profile every `freq_step`-th available frequency (default 1: all).
        min_frequency: Lowest frequency to profile, MHz (default: the lowest available).
        early_stop_after: Consecutive energy rises (``full``) or levels above the minimum
            (``coarse``) that stop an instruction (default 2).
        sweep: ``"coarse"`` (default: coarse clocks, then bisection where the hull bends) or
            ``"full"``; with `coarse_step`, `stop_margin`, `refine`, `refine_tolerance`.
    """

    Args = ProfilerArgs

    def __init__(
        self,
        job_info: JobInfo,
        rank_infos: list[RankInfo],
        perseus_settings: PerseusSettings,
        args: ProfilerArgs,
    ) -> None:
        super().__init__(job_info, rank_infos, perseus_settings, args)
        self.sweep = InstructionSweep(self, args)
        self.profile_path = self.job_dir.profile
        self._written = False
        if self.profile_path.is_file():
            # A restarted coordinator restoring this job: the profile is done already.
            self.sweep.phase = SweepPhase.DONE
            self._written = True

    def plan_next(self) -> StagePlan:
        return self.sweep.current_plan()

    def round_steps(self) -> int | None:
        return self.sweep.round_steps()

    def on_measurement(
        self, measurement: RoundMeasurement | None, results: list[ProfilingResult]
    ) -> None:
        self.sweep.observe(measurement)
        if self.sweep.done and not self._written:
            self.sweep.write_csv(self.profile_path)
            self._written = True
