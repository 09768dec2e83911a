"""The per-rank hook: `PerseusOptimizer` talks to the coordinator and drives one GPU.

```python
with PerseusOptimizer(rank=..., dp_rank=..., pp_rank=..., tp_rank=0, device_id=local_rank,
                      dp_degree=..., pp_degree=..., tp_degree=1, world_size=...,
                      server_url="http://127.0.0.1:7787") as perseus:
    for step in range(steps):
        perseus.on_step_begin()
        for kind in order:                      # "forward" / "backward", the 1F1B order
            perseus.on_instruction_begin(kind)
            ...compute...
            perseus.on_instruction_end(kind)
        perseus.on_step_end()
```

A round: the rank runs its `FrequencySchedule` for `steps_per_round` iterations, then a
background thread reports the round's `ProfilingResult` and asks for the next schedule (a
long-poll barrier over the job's talking ranks); the next `on_step_begin` collects it, and
any error the exchange met. The very first schedule is fetched in-band; a schedule may ask
for more iterations than `steps_per_round` (`FrequencySchedule.steps`: long profiling
rounds).

Leaders (protocol 2; `perseus.client.leaders`, `perseus.domain.layout.Leaders`): only the
tensor-rank-0 process of the first data-parallel replica (by default) of each pipeline
stage talks to the coordinator. On the exchange thread every rank folds its round into its
stage leader's over the job's own process group; the leader reports the group's result,
long-polls, and broadcasts the schedule it got to its group, each rank taking its
replica's list. The leaders are found from the layout the hook is given (its ranks and
degrees, or a ``device_mesh``), and the GPUs checked in-job to be of one type with one set
of clocks. With one replica and no tensor parallelism every rank leads itself, as before.

What the hook measures is what a GPU shows: each instruction's frequency is handed to the
`FrequencyController`'s thread, so the training loop never waits on the driver; each
instruction's time is measured (around a device synchronisation, or from CUDA events),
each iteration's energy from the energy counter, and the counter's refreshes, which a
background thread watches (`perseus.client.sensing`): at a round's end the round is cut at
them into energy windows that the coordinator turns into per-instruction energies. An
instruction's own energy cannot be read (the counter refreshes every 100 ms on an H100);
the per-instruction energies the hook reports are its share of its iteration's energy by
time. When the GPU has a `stand_in` (an `EmulatedGPU`: it runs no kernels itself), the hook
also stretches instructions to the locked clock and tells the emulator what they draw
(`perseus.client.emulation`); it reads their energy back only through the emulated GPU's
sensors, as on a real GPU.

While the coordinator is away (killed, restarting), the round's exchange retries for up to
``PERSEUS_RECONNECT_S`` (default 120 s; `perseus.client.coordinator`) and the rank waits
where it waits every round: in the next `on_step_begin`, between two steps, with its GPU
at the clock of its last instruction. All ranks of a job stop at the same step boundary
(the round barrier), so no rank runs a step its pipeline peers do not run; when the
restarted coordinator answers, training carries on with its schedule. If the window ends
first, `on_step_begin` raises the `CoordinatorError`.

This module is the state machine only; its parts are its sibling modules.

States (`_HookState`), and the calls that move between them (anything else is a `RankError`):

```
NEED_SCHEDULE --on_step_begin (fetches the schedule)--> IN_STEP
BETWEEN_STEPS --on_step_begin--> IN_STEP
IN_STEP --on_instruction_begin--> IN_INSTRUCTION --on_instruction_end--> IN_STEP
IN_STEP --on_step_end--> BETWEEN_STEPS, or NEED_SCHEDULE after the round's last step (reports)
IN_STEP, IN_INSTRUCTION --abort_step (the training step failed)--> BETWEEN_STEPS
any --close--> CLOSED
```

`close()` is the job's normal end: every rank waits there for the others (a barrier on the
job's process group) and the job's first leader (rank 0) then tells the coordinator that
the job finished (``POST /finish``), so it is listed as ``finished``, not failed. Leaving
the context manager on an exception, or ``close(finish=False)``, tells it nothing: a job
whose ranks fail ends as ``failed`` at the coordinator's round timeout.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

from perseus.client.bootstrap import (
    all_ranks_reach,
    check_layout,
    device_sync,
    process_group,
)
from perseus.client.console import setup_job_logging
from perseus.client.coordinator import CoordinatorClient, check_server_url
from perseus.client.emulation import EmulationSettings, InstructionEmulator
from perseus.client.frequency import FrequencyController, measure_switch_latency
from perseus.client.leaders import JobFanOut, mesh_place
from perseus.client.savings import SavingsLog
from perseus.client.schedule import ScheduleValidator
from perseus.client.sensing import CounterPoller, energy_windows, mean_power_w
from perseus.client.timing import TIMINGS, EventTimer, InstructionTiming
from perseus.client.trace import Trace
from perseus.errors import ConfigurationError, CoordinatorError, RankError
from perseus.protocol import (
    INSTRUCTIONS,
    PROTOCOL_VERSION,
    FrequencySchedule,
    JobInfo,
    JobOutcome,
    ParallelLayout,
    PipelineSpec,
    ProfilingResult,
    RankInfo,
    RoundStatus,
)
from zeus_power.device.base import GPU

__all__ = ["PerseusOptimizer"]

logger = logging.getLogger(__name__)


def _cuda_available() -> bool:
    """Whether torch sees a CUDA device (CUDA events can time instructions)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


class _HookState(enum.Enum):
    NEED_SCHEDULE = "waiting for the next round's schedule"
    BETWEEN_STEPS = "between two steps of a round"
    IN_STEP = "inside a step"
    IN_INSTRUCTION = "inside an instruction"
    CLOSED = "closed"


class _Exchange:
    """One call run on a daemon thread; `result()` returns its value or re-raises its error.

    A daemon thread (not an executor) so that a rank that exits never waits for a
    schedule long-poll that will not be answered.
    """

    def __init__(self, func: Callable[..., Any], *args: Any, name: str) -> None:
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        threading.Thread(target=self._run, args=(func, *args), name=name, daemon=True).start()

    def _run(self, func: Callable[..., Any], *args: Any) -> None:
        try:
            self._value = func(*args)
        except BaseException as exc:
            self._error = exc
        finally:
            self._done.set()

    def wait(self, timeout_s: float) -> bool:
        """Wait at most `timeout_s` for the call to end; whether it did."""
        return self._done.wait(timeout_s)

    def result(self) -> Any:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value


class PerseusOptimizer:
    """The per-rank Perseus hook (constructor as Zeus's `PipelineFrequencyOptimizer`).

    Needs an initialised `torch.distributed` process group spanning the job, and every
    rank to construct one (collective calls): the ranks exchange their places and GPUs,
    the job's first leader registers the job and broadcasts its id, and every leader
    registers its `RankInfo` (module docstring).

    Args:
        rank, dp_rank, pp_rank, tp_rank: This process's global and parallel ranks.
        device_id: Index of this rank's GPU (for `zeus_power.device.open_gpus`).
        dp_degree, pp_degree, tp_degree, world_size: The job's parallel layout.
        server_url: The coordinator, e.g. ``http://127.0.0.1:7787``.
        job_metadata: Free text appended to the job id.
        steps_per_round: Iterations run with each schedule before reporting.
        timeout_s: Timeout of every request but the schedule long-poll.
        round_timeout_s: Read timeout of the schedule long-poll; keep it above the
            coordinator's round timeout so that the coordinator's 504 (which names the
            missing ranks) arrives first.
        gpu: Use this GPU instead of opening `device_id`.
        emulation: Emulation mode for a GPU with a `stand_in` (default: from
            ``PERSEUS_EMULATE_*``).
        nominal_time_s: Instruction name → nominal time at the max clock (nominal emulation).
        expected_instructions: This stage's instruction names for one iteration, in
            execution order; a schedule that differs is rejected as soon as it arrives
            (default: this rank's order in `pipeline`, if given).
        pipeline: The pipeline the job runs (`PipelineSpec`: each pipeline rank's order of
            ``(stage, kind, microbatch)``); rank 0 sends it when it registers the job, so
            the coordinator plans for exactly this pipeline. Default: the coordinator's
            own (its scheduler arguments). `perseus.integrations.pipelining.attach`
            passes torch's schedule here.
        trace_dir: Write ``rank{R}.jsonl`` here (default: ``PERSEUS_TRACE_DIR``, if set).
        sync: Device synchronisation before each measurement (default: CUDA's, if any).
        timing: How instructions are timed: ``"sync"`` (a device synchronisation and two
            energy-counter reads around each one), ``"events"`` (CUDA events and a watcher
            thread, one synchronisation per iteration, each instruction at its iteration's
            mean power: `perseus.client.timing`; real CUDA GPUs with an energy counter
            only), or ``"auto"``: events where they can run, else sync. On an H100, sync
            timing cost +149 % per iteration and events +0.8 % (10 iterations a round;
            ``docs/measurements/h100-2026-11-24``). Default: ``PERSEUS_TIMING``, else auto.
        token: The coordinator's token (default: ``PERSEUS_TOKEN``, if set), sent with
            every request. Rank 0 passes the job's credential, which the coordinator
            answers when it registers the job, to the other ranks with the job id.
        leaders_per_stage: Leaders per pipeline stage (default 1; at most dp_degree): the
            data-parallel replicas are cut into that many blocks, and the tensor-rank-0
            process of each block's first replica talks for the block.
        device_mesh: The job's ``torch.distributed.DeviceMesh``, if it has one: this
            rank's dp, pp and tp coordinates and degrees are read from its named dimensions
            (`perseus.client.leaders.mesh_place`) and must agree with the ones given.
    """

    def __init__(
        self,
        rank: int,
        dp_rank: int,
        pp_rank: int,
        tp_rank: int,
        device_id: int,
        dp_degree: int,
        pp_degree: int,
        tp_degree: int,
        world_size: int,
        server_url: str,
        job_metadata: str | None = None,
        *,
        steps_per_round: int = 1,
        timeout_s: float = 30.0,
        round_timeout_s: float = 180.0,
        gpu: GPU | None = None,
        emulation: EmulationSettings | None = None,
        nominal_time_s: dict[str, float] | None = None,
        expected_instructions: Sequence[str] | None = None,
        trace_dir: str | os.PathLike[str] | None = None,
        sync: Callable[[], None] | None = None,
        pipeline: PipelineSpec | None = None,
        timing: str | None = None,
        token: str | None = None,
        leaders_per_stage: int = 1,
        device_mesh: Any = None,
    ) -> None:
        self._state = _HookState.CLOSED  # until construction succeeds
        setup_job_logging(rank)
        if device_mesh is not None:
            place = mesh_place(device_mesh)
            given = {
                "dp_rank": dp_rank,
                "dp_degree": dp_degree,
                "pp_rank": pp_rank,
                "pp_degree": pp_degree,
                "tp_rank": tp_rank,
                "tp_degree": tp_degree,
            }
            wrong = [
                f"{k}={v} (the mesh: {getattr(place, k)})"
                for k, v in given.items()
                if getattr(place, k) != v
            ]
            if wrong:
                raise ConfigurationError(
                    f"Rank {rank}: device_mesh disagrees with the layout given: {', '.join(wrong)}"
                )
        timing = timing if timing is not None else os.environ.get("PERSEUS_TIMING", "auto")
        if timing not in TIMINGS:
            raise ConfigurationError(
                f"timing={timing!r} (PERSEUS_TIMING) is not one of {', '.join(TIMINGS)}"
            )
        check_layout(rank, dp_rank, pp_rank, tp_rank, dp_degree, pp_degree, tp_degree, world_size)
        for name, value in (("timeout_s", timeout_s), ("round_timeout_s", round_timeout_s)):
            if not (math.isfinite(value) and value > 0):
                raise ConfigurationError(f"{name}={value!r} must be a positive number of seconds")
        if steps_per_round < 1:
            raise ConfigurationError(f"steps_per_round={steps_per_round!r} must be at least 1")
        self.server_url = check_server_url(server_url)
        self.rank, self.dp_rank, self.pp_rank, self.tp_rank = rank, dp_rank, pp_rank, tp_rank
        self.device_id = device_id
        self.dp_degree, self.pp_degree, self.tp_degree = dp_degree, pp_degree, tp_degree
        self.world_size = world_size
        self.steps_per_round = steps_per_round
        self.timeout_s = float(timeout_s)
        self.round_timeout_s = float(round_timeout_s)
        if pipeline is not None and pipeline.num_ranks != pp_degree:
            raise ConfigurationError(
                f"The pipeline's orders are for {pipeline.num_ranks} pipeline rank(s) but "
                f"pp_degree is {pp_degree}"
            )
        if expected_instructions is None and pipeline is not None:
            expected_instructions = [kind for _, kind, _ in pipeline.orders[pp_rank]]
        self.pipeline = pipeline
        self.expected_instructions = (
            list(expected_instructions) if expected_instructions is not None else None
        )
        dist = process_group(rank, world_size)
        self._dist = dist
        self.finish_report: JobOutcome | None = None
        """Rank 0, after a normal `close`: the coordinator's answer to the job's finish
        (rounds, iterations and energy measured, the energy report)."""

        if gpu is None:
            from zeus_power.device import open_gpus

            # Emulated only when asked for (ZEUS_GPU_BACKEND=emulated): without a driver and
            # without the opt-in this raises a GPUInitError that names it.
            gpu = open_gpus([device_id])[0]
        self.gpu = gpu
        self.emulated = gpu.emulated
        """This rank's GPU is emulated; the rank registers so, and its profile and plan say so."""
        if self.emulated:
            logger.info("Rank %d: GPU %d is emulated (%s)", rank, device_id, gpu.name())
        self._sync = sync if sync is not None else device_sync(device_id)
        # A GPU that runs no kernels itself offers a stand-in; real ones slow down by themselves.
        self._stand_in = gpu.stand_in
        self.emulator: InstructionEmulator | None = None
        if self._stand_in is not None:
            self.emulator = InstructionEmulator(
                self._stand_in,
                emulation or EmulationSettings(),
                nominal_time_s=nominal_time_s,
                rank=rank,
                stage=pp_rank,
            )
        self._energy_counter = gpu.supports_energy_counter()
        if timing == "auto":
            real = self._stand_in is None and self._energy_counter
            timing = "events" if real and _cuda_available() else "sync"
        if timing == "events" and (self._stand_in is not None or not self._energy_counter):
            raise ConfigurationError(
                "timing='events' needs a real GPU with an energy counter; "
                f"{gpu!r} is emulated or has none: use timing='sync'"
            )
        self.timing = timing
        self._events: EventTimer | None = None
        self._events_steps: list[tuple[int, int, float, list[InstructionTiming]]] = []
        """Events timing: each step of the round so far (step, slot, time, instructions)."""
        self.available_frequencies = sorted(gpu.supported_sm_clocks_mhz(), reverse=True)
        self.switch_latency_s = measure_switch_latency(gpu, self.available_frequencies)
        """How long this GPU took to apply a locked clock (measured here; None: unknown)."""
        if self.switch_latency_s is not None:
            logger.debug(
                "Rank %d: GPU %d applies a locked clock in %.1f ms (measured)",
                rank,
                device_id,
                self.switch_latency_s * 1000,
            )
        self._schedule = ScheduleValidator(
            rank=rank,
            pp_rank=pp_rank,
            available_frequencies=self.available_frequencies,
            expected_instructions=self.expected_instructions,
        )

        if token is None:
            token = os.environ.get("PERSEUS_TOKEN") or None
        self._coordinator = CoordinatorClient(
            self.server_url, timeout_s=self.timeout_s, token=token
        )
        self._trace: Trace | None = None
        self._freq: FrequencyController | None = None
        self.leaders_per_stage = leaders_per_stage

        def register_job() -> str:  # the first leader only; the others learn its result
            job_info = JobInfo(
                pp_degree=pp_degree,
                dp_degree=dp_degree,
                tp_degree=tp_degree,
                world_size=world_size,
                job_metadata=job_metadata,
                pipeline=pipeline,
                protocol_version=PROTOCOL_VERSION,
                leaders_per_stage=leaders_per_stage,
            )
            job_id = self._coordinator.register_job(job_info)
            # The job's credential travels with its id (ids never hold a newline).
            return f"{job_id}\n{self._coordinator.job_token(job_id) or ''}"

        self._poller: CounterPoller | None = None
        try:
            refresh_s = None
            if self._energy_counter:
                # The counter's refresh period, measured here (a few hundred ms): the
                # coordinator sizes profiling rounds from it.
                self._poller = CounterPoller(
                    gpu.total_energy_mj, name=f"perseus-counter-rank{rank}"
                )
                refresh_s = self._poller.wait_period()
                logger.info(
                    "Rank %d: the energy counter refreshes %s",
                    rank,
                    "continuously"
                    if refresh_s == 0.0
                    else "at an unknown period"
                    if refresh_s is None
                    else f"every {refresh_s * 1000:.1f} ms",
                )
            # Collective: every rank learns every rank's place and GPU, checks them, and
            # joins its stage leader's group (perseus.client.leaders).
            self._fanout = JobFanOut(
                dist,
                rank=rank,
                dp_rank=dp_rank,
                pp_rank=pp_rank,
                tp_rank=tp_rank,
                layout=ParallelLayout(dp_degree, pp_degree, tp_degree),
                per_stage=leaders_per_stage,
                steps_per_round=steps_per_round,
                pipeline_key=pipeline.model_dump_json() if pipeline is not None else "",
                gpu_name=gpu.name(),
                frequencies=self.available_frequencies,
                emulated=self.emulated,
                switch_latency_s=self.switch_latency_s,
                timeout_s=self.round_timeout_s + self._coordinator.reconnect_s + 4 * self.timeout_s,
            )
            shared = self._fanout.share_job_id(register_job)
            self.job_id, _, job_token = shared.partition("\n")
            self._coordinator.set_job_token(self.job_id, job_token or None)
            if self._fanout.is_leader:  # it speaks for its group
                self._coordinator.register_rank(
                    self.job_id,
                    RankInfo(
                        rank=rank,
                        dp_rank=dp_rank,
                        pp_rank=pp_rank,
                        tp_rank=tp_rank,
                        available_frequencies=self.available_frequencies,
                        emulated=self.emulated,
                        energy_refresh_s=refresh_s,
                        switch_latency_s=self._fanout.switch_latency_s,
                        replicas=list(self._fanout.replicas),
                    ),
                )
            if rank == self._fanout.registrar:
                shape = (
                    f"{pipeline.schedule}, {pipeline.num_microbatches} microbatches"
                    if pipeline is not None
                    else "the coordinator's default pipeline"
                )
                switch = (
                    f"{self.switch_latency_s * 1000:.1f} ms"
                    if self.switch_latency_s is not None
                    else "unknown"
                )
                logger.info(
                    "Perseus: job %s registered with %s: %d rank(s) (pp %d × dp %d × tp %d), "
                    "%s; %d leader(s) talk to the coordinator; clock switch on GPU %d: %s",
                    self.job_id,
                    self.server_url,
                    world_size,
                    pp_degree,
                    dp_degree,
                    tp_degree,
                    shape,
                    self._fanout.leaders.count,
                    device_id,
                    switch,
                )
            self._trace = Trace.open(trace_dir, rank)
            job_record: dict[str, Any] = {
                "kind": "job",
                "job_id": self.job_id,
                "rank": rank,
                "leader": self._fanout.leader,
                "dp_rank": dp_rank,
                "pp_rank": pp_rank,
                "tp_rank": tp_rank,
            }
            if self.emulated:
                job_record["emulated"] = True  # the trace's times and energies are a model's
            self._write_trace(job_record)
            # A GPU that emulates itself changes clocks in memory: no worker thread to wake.
            self._freq = FrequencyController(gpu, inline=gpu.stand_in is gpu)
            if self.timing == "events":
                self._events = EventTimer(device_id, self._energy_mj, self._freq.request)
        except BaseException:
            self._coordinator.close()
            if self._trace is not None:
                self._trace.close()
            if self._poller is not None:
                self._poller.close()
            if self.emulator is not None:
                self.emulator.close()
            raise

        self._state = _HookState.NEED_SCHEDULE
        self._pending: _Exchange | None = None
        self._reported = threading.Event()
        self.round = -1
        self.step = 0
        self._step_in_round = 0
        self._instr_start_s = 0.0
        self._instr_stage: int | None = None
        self._instr_microbatch: int | None = None
        self._step_start_s = 0.0
        self._step_start_mj = 0.0
        self._iter_time: list[float] = []
        self._iter_energy: list[float] = []
        self._time_breakdown: dict[str, list[list[float]]] = {}
        self._energy_breakdown: dict[str, list[list[float]]] = {}
        self._round_steps = steps_per_round
        """Iterations of the current round: max(steps_per_round, the schedule's steps)."""
        self._round_start_s = 0.0
        self._round_end_s = 0.0
        self._intervals: list[tuple[int, float, float]] = []
        """The round's instructions so far: (index in the iteration, start, end), host clock."""
        self._step_instrs: list[tuple[str, float]] = []
        """Sync timing: the step's instructions (name, time) until its energy is known."""
        self._savings = SavingsLog(rank, max(self.available_frequencies, default=0), logger)
        self.status: RoundStatus | None = None
        """The job's status as the coordinator last sent it (rank 0 only)."""

    def announce_straggler(self, dp_rank: int, slowdown: float) -> None:
        """Tell the coordinator that pipeline `dp_rank` runs `slowdown` times slower (1.0: recovered)."""
        if not (0 <= dp_rank < self.dp_degree):
            raise ConfigurationError(f"dp_rank={dp_rank!r} must be in [0, {self.dp_degree})")
        if not (math.isfinite(slowdown) and slowdown >= 1.0):
            raise ConfigurationError(f"slowdown={slowdown!r} must be a number >= 1.0")
        self._coordinator.announce_straggler(self.job_id, dp_rank, slowdown)

    # ------------------------------------------------------------------ measurement
    def _energy_mj(self) -> float:
        if self._energy_counter:
            poller = self._poller
            if poller is not None and poller.period_s and poller.error is None:
                # The counter only moves at its refreshes, which the poller reads around:
                # its last value is the counter's now, without another read (2.4 ms on an
                # H100) on the training thread.
                latest = poller.latest_mj()
                if latest is not None:
                    return float(latest)
            return float(self.gpu.total_energy_mj())
        return 0.0

    def _round_windows(self, end_s: float) -> list[Any] | None:
        """The round cut at the counter's refreshes (None without a counter)."""
        poller = self._poller
        if poller is None:
            return None
        if poller.error is not None:
            logger.warning(
                "Rank %d: the energy counter's watcher stopped (%s); no energy windows",
                self.rank,
                poller.error,
            )
            self._poller = None
            return None
        ticks = poller.ticks(self._round_start_s, end_s)
        windows = energy_windows(
            ticks,
            self._intervals,
            len(self._schedule.frequencies),
            start_s=self._round_start_s,
            end_s=end_s,
        )
        poller.forget(end_s - 1.0)
        if poller.period_s:
            power_w = mean_power_w(ticks, end_s - self._round_start_s)
            if power_w is not None:
                self._spread_round_energy(power_w)
        return windows

    def _spread_round_energy(self, power_w: float) -> None:
        """Each step's energy (and its instructions'): the round's mean power between its
        first and last refresh × their time. A refreshing counter read at a step's ends
        lags each end by up to a period, which for steps of a few hundred ms is 0, one or
        two refreshes of energy; between refreshes it is exact. The trace keeps the reads."""
        self._iter_energy = [power_w * t for t in self._iter_time]
        self._energy_breakdown = {
            name: [[power_w * t for t in step] for step in steps]
            for name, steps in self._time_breakdown.items()
        }

    def _energy_since(self, start_mj: float, duration_s: float) -> float:
        """Joules since a counter reading (or power × time on GPUs without a counter)."""
        if self._energy_counter:
            return (self._energy_mj() - start_mj) / 1000.0
        return self.gpu.power_usage_mw() / 1000.0 * duration_s

    def _write_trace(self, record: dict[str, Any]) -> None:
        if self._trace is not None:
            self._trace.write(record)

    def _expect(self, *states: _HookState, call: str) -> None:
        if self._state not in states:
            raise RankError(
                f"Rank {self.rank}: {call}() called {self._state.value}; expected "
                + " or ".join(s.value for s in states)
            )

    # ------------------------------------------------------------------ schedule
    def _get_schedule(self) -> FrequencySchedule:
        """The next round's schedule: a leader asks the coordinator and hands it out to its
        group; the others take their leader's. Either way the leader's (group's) schedule."""
        round_ = self.round + 1
        fanout = self._fanout
        if not fanout.is_leader:
            return fanout.receive(round_)
        try:
            schedule = self._coordinator.get_schedule(
                self.job_id, self.rank, timeout_s=self.round_timeout_s
            )
        except BaseException as exc:
            self._hand_out_error(exc)
            raise
        fanout.hand_out(round_, schedule)
        return schedule

    def _hand_out_error(self, exc: BaseException) -> None:
        """A leader that got no schedule tells its group why (never masking `exc`)."""
        with contextlib.suppress(Exception):
            self._fanout.hand_out(self.round + 1, None, f"{type(exc).__name__}: {exc}")

    def _exchange(self, result: ProfilingResult) -> FrequencySchedule:
        """Report a round and ask for the next schedule (runs on the exchange thread): every
        rank folds its result into its leader's, which reports the group's."""
        fanout = self._fanout
        try:
            try:
                folded = fanout.gather(result)
                if folded is not None:
                    self._coordinator.report_result(self.job_id, folded)
            finally:
                self._reported.set()
        except BaseException as exc:
            if fanout.is_leader:
                self._hand_out_error(exc)
            raise
        return self._get_schedule()

    def _fetch_schedule(self) -> None:
        exchange, self._pending = self._pending, None
        handed = exchange.result() if exchange is not None else self._get_schedule()
        schedule = FrequencySchedule(
            rank=self.rank,
            frequencies=handed.frequencies_for(self.dp_rank),
            steps=handed.steps,
            status=handed.status if self._fanout.is_leader else None,
        )
        frequencies = self._schedule.accept(schedule, self.round + 1)
        self._round_steps = max(self.steps_per_round, schedule.steps or 0)
        self.round += 1
        if schedule.status is not None:
            self.status = schedule.status
            for note in schedule.status.notes:
                logger.log(
                    logging.WARNING if note.level == "warning" else logging.INFO,
                    "Perseus: %s",
                    note.text,
                )
        self._savings.schedule(self.round, [f for _, f in schedule.frequencies])
        record: dict[str, Any] = {
            "kind": "schedule",
            "round": self.round,
            "step": self.step,
            "frequencies": frequencies,
            "leader": self._fanout.leader,
        }
        if self._fanout.is_leader and len(self._fanout.members) > 1:  # what its group got
            record["handed_out"] = {
                "frequencies": handed.frequencies,
                "replica_frequencies": handed.replica_frequencies,
            }
        self._write_trace(record)

    # ------------------------------------------------------------------ the hook
    def on_step_begin(self) -> None:
        """Mark the beginning of an iteration (fetches the schedule at a round's start)."""
        self._expect(_HookState.NEED_SCHEDULE, _HookState.BETWEEN_STEPS, call="on_step_begin")
        if self._state is _HookState.NEED_SCHEDULE:
            self._fetch_schedule()
            self._step_in_round = 0
            self._iter_time, self._iter_energy = [], []
            self._time_breakdown = {name: [] for name in INSTRUCTIONS}
            self._energy_breakdown = {name: [] for name in INSTRUCTIONS}
            self._intervals = []
        first = self._step_in_round == 0
        for name in INSTRUCTIONS:
            self._time_breakdown[name].append([])
            self._energy_breakdown[name].append([])
        self._schedule.start_step()
        self._state = _HookState.IN_STEP
        self._step_instrs = []
        if self._events is not None:  # the counter is read off this thread
            self._events.step_begin()
            self._step_start_s = time.perf_counter()
            return
        self._sync()
        self._step_start_mj = self._energy_mj()
        self._step_start_s = time.perf_counter()
        if first:
            self._round_start_s = self._step_start_s

    def on_instruction_begin(
        self, name: str, *, stage: int | None = None, microbatch: int | None = None
    ) -> None:
        """Mark the beginning of instruction `name` (an instruction kind: "forward",
        "backward", "backward_input" or "backward_weight"); sets its clock.

        `stage` and `microbatch` (optional) say which pipeline stage and microbatch it
        computes: they go to the trace, and `stage` picks a stage's own nominal time in
        nominal emulation.
        """
        self._expect(_HookState.IN_STEP, call="on_instruction_begin")
        freq = self._schedule.begin(name, self.step)
        assert self._freq is not None
        self._state = _HookState.IN_INSTRUCTION
        if self._events is not None:  # the watcher asks for the clock when the GPU gets here
            self._events.begin(name, freq, stage, microbatch)
            return
        self._freq.request(freq)
        self._sync()
        if self.emulator is not None:
            # The emulated switch starts now, not whenever the worker thread gets to it;
            # the emulated GPU draws the instruction's power from now on.
            self._freq.wait_applied()
            self.emulator.begin(name, freq)
        self._instr_stage, self._instr_microbatch = stage, microbatch
        self._instr_start_s = time.perf_counter()

    def on_instruction_end(
        self, name: str, *, stage: int | None = None, microbatch: int | None = None
    ) -> None:
        """Mark the end of instruction `name`: measure (and, emulated, stretch) it.

        `stage`/`microbatch` default to those given to `on_instruction_begin`.
        """
        self._expect(_HookState.IN_INSTRUCTION, call="on_instruction_end")
        freq = self._schedule.end(name, self.step)
        if self._events is not None:  # measured at the round's end (`_events_round_end`)
            self._events.end()
            self._schedule.advance()
            self._state = _HookState.IN_STEP
            return
        self._sync()
        compute_s = -1.0
        if self.emulator is not None:
            compute_end_s = time.perf_counter()
            assert self._freq is not None and self._stand_in is not None
            self._freq.wait_applied()
            freq = self._stand_in.target_sm_clock_mhz()
            duration_s = self.emulator.finish(
                name,
                self._instr_start_s,
                freq,
                compute_end_s=compute_end_s,
                stage=stage if stage is not None else self._instr_stage,
            )
            compute_s = self.emulator.last_compute_s
        else:
            duration_s = time.perf_counter() - self._instr_start_s
        index = self._schedule.index
        self._intervals.append((index, self._instr_start_s, self._instr_start_s + duration_s))
        self._trace_instruction(
            name,
            index,
            stage if stage is not None else self._instr_stage,
            microbatch if microbatch is not None else self._instr_microbatch,
            freq,
            duration_s,
            compute_s=compute_s,
        )
        # Its energy share is known once the step's energy is (on_step_end).
        self._step_instrs.append((name, duration_s))
        self._schedule.advance()
        self._state = _HookState.IN_STEP

    def _trace_instruction(
        self,
        name: str,
        index: int,
        stage: int | None,
        microbatch: int | None,
        freq: int,
        duration_s: float,
        *,
        step: int | None = None,
        compute_s: float = -1.0,
    ) -> None:
        if self._trace is not None:
            record = {
                "kind": "instruction",
                "round": self.round,
                "step": self.step if step is None else step,
                "index": index,
                "instruction": name,
                "stage": stage,
                "microbatch": microbatch,
                "freq_mhz": freq,
                "time_s": duration_s,
            }
            if compute_s >= 0:
                record["compute_s"] = compute_s
            self._trace.write(record)

    def on_step_end(self) -> None:
        """Mark the end of an iteration; reports the round's results after its last step."""
        self._expect(_HookState.IN_STEP, call="on_step_end")
        if self._events is not None:
            self._events_step_end()
        else:
            self._sync()
            end_s = time.perf_counter()
            iter_time_s = end_s - self._step_start_s
            iter_energy_j = self._energy_since(self._step_start_mj, iter_time_s)
            self._schedule.finish_step(self.step)
            power_w = iter_energy_j / iter_time_s if iter_time_s > 0 else 0.0
            for name, time_s in self._step_instrs:
                self._time_breakdown[name][-1].append(time_s)
                self._energy_breakdown[name][-1].append(power_w * time_s)
            self._step_instrs = []
            self._step_measured(self.step, iter_time_s, iter_energy_j)
            self._round_end_s = end_s
        self.step += 1
        self._step_in_round += 1
        if self._step_in_round < self._round_steps:
            self._state = _HookState.BETWEEN_STEPS
            return
        if self._events is not None:
            self._events_round_end()
        result = ProfilingResult(
            rank=self.rank,
            iter_time=self._iter_time,
            iter_energy=self._iter_energy,
            time_breakdown=self._time_breakdown,
            energy_breakdown=self._energy_breakdown,
            energy_windows=self._round_windows(self._round_end_s),
        )
        self._savings.measured(self._iter_time, self._iter_energy)
        self._state = _HookState.NEED_SCHEDULE
        # Reporting and the next schedule's long-poll run off the training thread; the
        # next on_step_begin collects the schedule (and any error) from it.
        self._reported.clear()
        self._pending = _Exchange(self._exchange, result, name=f"perseus-round-rank{self.rank}")

    def _step_measured(self, step: int, iter_time_s: float, iter_energy_j: float) -> None:
        self._iter_time.append(iter_time_s)
        self._iter_energy.append(iter_energy_j)
        self._write_trace(
            {
                "kind": "step",
                "round": self.round,
                "step": step,
                "iter_time_s": iter_time_s,
                "iter_energy_j": iter_energy_j,
            }
        )

    def _events_step_end(self) -> None:
        """Events timing: the step's instruction times now, its energy at the round's end."""
        assert self._events is not None
        timings = self._events.step_end()
        iter_time_s = time.perf_counter() - self._step_start_s
        self._schedule.finish_step(self.step)
        self._events_steps.append((self.step, self._step_in_round, iter_time_s, timings))

    def _events_round_end(self) -> None:
        """Events timing: each step's energy (read by the watcher), shared by time."""
        assert self._events is not None
        steps, self._events_steps = self._events_steps, []
        energies = self._events.step_energies_j()
        spans = self._events.last_spans
        for (step, slot, iter_time_s, timings), energy_j, (begin_s, _) in zip(
            steps, energies, spans, strict=True
        ):
            power_w = energy_j / iter_time_s if iter_time_s > 0 else 0.0
            for index, t in enumerate(timings):
                start_s = begin_s + t.offset_s  # the GPU's own timestamps, from the step's mark
                self._intervals.append((index, start_s, start_s + t.time_s))
                self._time_breakdown[t.name][slot].append(t.time_s)
                self._energy_breakdown[t.name][slot].append(power_w * t.time_s)
                self._trace_instruction(
                    t.name, index, t.stage, t.microbatch, t.freq_mhz, t.time_s, step=step
                )
            self._step_measured(step, iter_time_s, energy_j)
        if spans:
            self._round_start_s, self._round_end_s = spans[0][0], spans[-1][1]

    def abort_step(self) -> None:
        """Forget the step in progress after the training step failed: its instructions'
        measurements are dropped and the next `on_step_begin` starts the step again (same
        schedule, same round). Does nothing between steps."""
        if self._state not in (_HookState.IN_STEP, _HookState.IN_INSTRUCTION):
            return
        for name in INSTRUCTIONS:
            self._time_breakdown[name].pop()
            self._energy_breakdown[name].pop()
        # The failed step's instructions stay in the energy windows: the GPU ran them.
        self._step_instrs = []
        if self._events is not None:
            self._events.discard()
        self._schedule.start_step()
        self._state = _HookState.BETWEEN_STEPS
        logger.warning(
            "Rank %d: step %d failed; its measurements are dropped", self.rank, self.step
        )

    # ------------------------------------------------------------------ lifecycle
    def close(self, *, finish: bool = True) -> None:
        """Stop the frequency worker, restore the GPU's clocks, close the HTTP client.

        `finish` (the default: a normal end of training): the job is over; every rank waits
        here for the others (at most twice `timeout_s`), then rank 0 tells the coordinator
        (``POST /finish``), which lists the job as ``finished``. A finish that cannot be
        told is a warning, never an error. ``finish=False`` (training failed) tells the
        coordinator nothing: the job fails at its round timeout.
        """
        if self._state is _HookState.CLOSED and self._freq is None:
            return
        self._state = _HookState.CLOSED
        self._savings.log_saving()
        pending, self._pending = self._pending, None
        if pending is not None and not self._reported.wait(self.timeout_s):
            logger.warning(
                "Rank %d: the last round's report did not reach the coordinator", self.rank
            )
        try:
            if self._poller is not None:
                poller, self._poller = self._poller, None
                poller.close()
            if self.emulator is not None:
                self.emulator.close()
            if self._events is not None:
                events, self._events = self._events, None
                events.close()
            if self._freq is not None:
                freq, self._freq = self._freq, None
                freq.close()
            if finish:
                self._finish()
                if self.rank == self._fanout.registrar:
                    logger.info("Perseus: job %s ends: %s", self.job_id, self._end_line())
                # The next round's exchange is still running: a leader's long-poll ends now
                # that the job has finished, and it tells its group, whose ranks wait for
                # it in a collective that must end before their process group goes.
                if pending is not None and not pending.wait(2 * self.timeout_s):
                    logger.warning(
                        "Rank %d: the next round's exchange did not end after the job's finish",
                        self.rank,
                    )
        finally:
            self._coordinator.close()
            if self._trace is not None:
                self._trace.close()
                self._trace = None

    def _finish(self) -> None:
        """Every rank closed: the job's first leader (rank 0) tells the coordinator the job
        finished."""
        if self.world_size > 1:
            why_not = all_ranks_reach(self._dist, 2 * self.timeout_s)
            if why_not is not None and self._dist.is_initialized():
                if self.rank == self._fanout.registrar:
                    logger.warning(
                        "Job %s: not telling the coordinator that it finished: %s; it will "
                        "be marked failed at the coordinator's round timeout",
                        self.job_id,
                        why_not,
                    )
                return
        if self.rank != self._fanout.registrar:
            return
        try:
            self.finish_report = self._coordinator.finish_job(self.job_id)
        except CoordinatorError as exc:
            logger.warning(
                "Job %s: could not tell the coordinator it finished: %s", self.job_id, exc
            )

    def _end_line(self) -> str:
        """What the job did, one line: the coordinator's answer to the finish, else the last
        status it sent."""
        outcome = self.finish_report
        if outcome is None:
            status = self.status.summary if self.status is not None else None
            return status or "the coordinator sent no figures"
        total = (
            f"{outcome.energy_j:,.0f} J over {outcome.iterations_measured} measured "
            "iteration(s), all GPUs"
        )
        if outcome.measured_saving is None or outcome.measured_slowdown is None:
            return f"no plan was measured against all-max; {total}"
        return (
            f"measured saving {outcome.measured_saving:.2%} at {outcome.measured_slowdown:+.2%} "
            f"slowdown against its all-max rounds (medians); {total}"
        )

    def __enter__(self) -> PerseusOptimizer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        # Already failing: restore what can be restored, but never mask the original error.
        try:
            self.close(finish=False)
        except Exception as close_exc:
            logger.warning(
                "Rank %d: closing the Perseus hook also failed: %s", self.rank, close_exc
            )
