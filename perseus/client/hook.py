"""The per-rank hook: `PerseusOptimizer`, the state machine a training job calls on every rank.

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

(or ``PerseusOptimizer.from_layout(ParallelLayout(dp, pp, tp), rank=..., pp_rank=...,
device_id=..., server_url=...)``, or ``from_layout(device_mesh, ...)``).

A round: the rank runs its `FrequencySchedule` for `steps_per_round` iterations (or the
schedule's `steps`, if more), then reports it and gets the next schedule off the training
thread (`perseus.client.wire.exchange`); the next `on_step_begin` collects it (and raises any
error the exchange met). The parts are sibling modules: `rank_gpu` (timing, energy, clocks),
`registration`, `exchange`, `finish`, `settings`, `lifecycle` (the ``with`` rule).

States (`_HookState`), and the calls that move between them (anything else is a `RankError`):

```
NOT_CONNECTED --connect (the constructor calls it)--> NEED_SCHEDULE
NEED_SCHEDULE --on_step_begin (fetches the schedule)--> IN_STEP
BETWEEN_STEPS --on_step_begin--> IN_STEP
IN_STEP --on_instruction_begin--> IN_INSTRUCTION --on_instruction_end--> IN_STEP
IN_STEP --on_step_end--> BETWEEN_STEPS, or NEED_SCHEDULE after the round's last step (reports)
IN_STEP, IN_INSTRUCTION --abort_step (the training step failed)--> BETWEEN_STEPS
any --close--> CLOSED
```

`close()` is the job's normal end (the coordinator lists the job ``finished``);
``close(finish=False)`` tells the coordinator nothing (the job fails at its round timeout).
"""

from __future__ import annotations

import enum
import functools
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from perseus.client.bootstrap import process_group
from perseus.client.console import setup_job_logging
from perseus.client.gpu.rank_gpu import RankGPU
from perseus.client.gpu.rounds import RoundRecord
from perseus.client.gpu.timing import Timing
from perseus.client.lifecycle import ClosesOnExit
from perseus.client.options import HookKeywords, HookOptions
from perseus.client.place import RankPlace, check_layout
from perseus.client.savings import SavingsLog
from perseus.client.schedule import ScheduleValidator
from perseus.client.trace import Trace, job_record, schedule_record
from perseus.client.wire.coordinator import CoordinatorClient, check_server_url
from perseus.client.wire.exchange import Background, RoundExchange
from perseus.client.wire.finish import finish_job
from perseus.client.wire.registration import register
from perseus.errors import ConfigurationError, DeviceError, RankError
from perseus.protocol import JobOutcome, ParallelLayout, RoundStatus
from zeus_power.device.base import GPUError

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["PerseusOptimizer"]

logger = logging.getLogger(__name__)

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _device_errors(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """The hook's public calls raise `PerseusError`s only: the device layer's own errors
    (its `GPUError`s: `zeus_power` knows nothing of Perseus) come out as `DeviceError`, the
    original as its ``__cause__``."""

    @functools.wraps(method)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(*args, **kwargs)
        except GPUError as exc:
            raise DeviceError(f"{type(exc).__name__}: {exc}") from exc

    return call


class _HookState(enum.Enum):
    NOT_CONNECTED = "before connect()"
    NEED_SCHEDULE = "waiting for the next round's schedule"
    BETWEEN_STEPS = "between two steps of a round"
    IN_STEP = "inside a step"
    IN_INSTRUCTION = "inside an instruction"
    CLOSED = "closed"


class PerseusOptimizer(ClosesOnExit):
    """The per-rank Perseus hook (constructor as Zeus's `PipelineFrequencyOptimizer`).

    Needs an initialised `torch.distributed` process group spanning the job, and every
    rank to construct one: the constructor checks its arguments, opens the GPU and sets up
    the measurement, then calls `connect` (collective: the ranks exchange their places and
    GPUs, the job's first leader registers the job and broadcasts its id, and every leader
    registers its `RankInfo`); ``connect=False`` leaves that to the caller.

    Args:
        rank, dp_rank, pp_rank, tp_rank: This process's global and parallel ranks.
        device_id: Index of this rank's GPU (for `zeus_power.device.open_gpus`).
        dp_degree, pp_degree, tp_degree, world_size: The job's parallel layout.
        server_url: The coordinator, e.g. ``http://127.0.0.1:7787``.
        job_metadata: Free text appended to the job id.
        **options: Keyword-only, each documented in `perseus.client.options.HookOptions`
            (``steps_per_round``, ``pipeline``, ``gpu``, ``timing``, ``trace_dir``, ...).
    """

    @_device_errors
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
        **options: Unpack[HookKeywords],
    ) -> None:
        self._state = _HookState.CLOSED  # until construction succeeds
        opts = HookOptions(**options)
        settings = opts.client_settings()
        setup_job_logging(rank, level=settings.log_level)
        place = check_layout(
            rank, dp_rank, pp_rank, tp_rank, dp_degree, pp_degree, tp_degree, world_size
        )
        if opts.device_mesh is not None:
            place.check_mesh(opts.device_mesh)
        self.place = place
        self.server_url = check_server_url(server_url)
        self.rank, self.dp_rank, self.pp_rank, self.tp_rank = rank, dp_rank, pp_rank, tp_rank
        self.dp_degree, self.pp_degree, self.tp_degree = dp_degree, pp_degree, tp_degree
        self.device_id, self.world_size = device_id, world_size
        self.job_metadata, self.steps_per_round = job_metadata, opts.steps_per_round
        self.timeout_s, self.round_timeout_s = opts.timeout_s, opts.round_timeout_s
        self.leaders_per_stage, self.pipeline = opts.leaders_per_stage, opts.pipeline
        self.expected_instructions = opts.expected_for(pp_rank, pp_degree)
        self._dist = process_group(rank, world_size)
        self.finish_report: JobOutcome | None = None
        """The job's first leader, after a normal `close`: the coordinator's answer to the
        job's finish (rounds, iterations and energy measured, the energy report)."""
        self.status: RoundStatus | None = None
        """The job's status as the coordinator last sent it (leaders only)."""
        side = self._gpu = RankGPU(rank, pp_rank, device_id, opts, settings)
        self.gpu, self.emulated, self.emulator = side.gpu, side.emulated, side.emulator
        self.timing = self._gpu.timing
        """The timing in use, ``sync`` or ``events`` (`perseus.client.gpu.timing`)."""
        self.available_frequencies = self._gpu.frequencies
        self.switch_latency_s = self._gpu.switch_latency_s
        """How long this GPU took to apply a locked clock (measured here; None: unknown)."""
        self._schedule = ScheduleValidator(
            rank=rank,
            pp_rank=pp_rank,
            available_frequencies=self.available_frequencies,
            expected_instructions=self.expected_instructions,
        )
        self._trace_dir = settings.trace_dir
        self._coordinator = CoordinatorClient(
            self.server_url,
            timeout_s=self.timeout_s,
            token=settings.token_value,
            reconnect_s=settings.reconnect_s,
        )
        self._trace: Trace | None = None
        self._timing: Timing | None = None
        self._pending: Background | None = None
        self._savings = SavingsLog(rank, max(self.available_frequencies, default=0), logger)
        self.round, self.step, self._step_in_round = -1, 0, 0
        self._round_steps = self.steps_per_round
        """Iterations of the current round: max(steps_per_round, the schedule's steps)."""
        self._record = RoundRecord(-1, self._write_trace)
        self._state = _HookState.NOT_CONNECTED
        if opts.connect:
            self.connect()

    @classmethod
    def from_layout(
        cls,
        layout: ParallelLayout | Any,
        *,
        rank: int,
        device_id: int,
        server_url: str,
        dp_rank: int = 0,
        pp_rank: int = 0,
        tp_rank: int = 0,
        **options: Any,
    ) -> PerseusOptimizer:
        """The hook of `rank` in a `ParallelLayout` (its coordinates given) or a ``DeviceMesh``
        (read from its named dimensions); `options` as the constructor's keywords."""
        place = RankPlace.of(layout, rank=rank, dp_rank=dp_rank, pp_rank=pp_rank, tp_rank=tp_rank)
        if place.layout is not layout:  # a DeviceMesh: the job's table is checked against it
            options.setdefault("device_mesh", layout)
        arguments = place.zeus_arguments()
        return cls(**arguments, device_id=device_id, server_url=server_url, **options)

    @_device_errors
    def connect(self) -> None:
        """Register with the coordinator and join the job's fan-out (collective: every rank
        calls it once; the constructor does unless given ``connect=False``). On failure
        everything the hook opened is closed and the error raised."""
        self._expect(_HookState.NOT_CONNECTED, call="connect")
        # A follower waits in the fan-out for its leader's whole exchange with the coordinator.
        fanout_timeout_s = self.round_timeout_s + self._coordinator.reconnect_s + 4 * self.timeout_s
        try:
            registration = register(
                self._coordinator,
                self._dist,
                self.place,
                self._gpu.facts(),
                job_metadata=self.job_metadata,
                pipeline=self.pipeline,
                leaders_per_stage=self.leaders_per_stage,
                steps_per_round=self.steps_per_round,
                fanout_timeout_s=fanout_timeout_s,
            )
            self.job_id, self._fanout = registration.job_id, registration.fanout
            self._exchange = RoundExchange(
                self._coordinator,
                self._fanout,
                job_id=self.job_id,
                rank=self.rank,
                round_timeout_s=self.round_timeout_s,
            )
            self._trace = Trace.open(self._trace_dir, self.rank)
            leader = self._fanout.leader
            self._write_trace(job_record(self.job_id, self.place, leader, self.emulated))
            self._timing = self._gpu.start_timing()
        except BaseException:
            self._state = _HookState.CLOSED
            self._release()
            raise
        self._state = _HookState.NEED_SCHEDULE

    @_device_errors
    def announce_straggler(self, dp_rank: int, slowdown: float) -> None:
        """Tell the coordinator that pipeline `dp_rank` runs `slowdown` times slower (1.0: recovered)."""
        if not (0 <= dp_rank < self.dp_degree):
            raise ConfigurationError(f"dp_rank={dp_rank!r} must be in [0, {self.dp_degree})")
        if not (math.isfinite(slowdown) and slowdown >= 1.0):
            raise ConfigurationError(f"slowdown={slowdown!r} must be a number >= 1.0")
        self._coordinator.announce_straggler(self.job_id, dp_rank, slowdown)

    def _write_trace(self, record: dict[str, Any]) -> None:
        if self._trace is not None:
            self._trace.write(record)

    def _expect(self, *states: _HookState, call: str) -> Timing:
        """The timing, once the hook is in one of `states`; else a `RankError`."""
        if self._state not in states or (self._timing is None and call != "connect"):
            raise RankError(
                f"Rank {self.rank}: {call}() called {self._state.value}; expected "
                + " or ".join(s.value for s in states)
            )
        return self._timing  # type: ignore[return-value]  # None only before connect

    # ------------------------------------------------------------------ the hook
    @_device_errors
    def on_step_begin(self) -> None:
        """Mark the beginning of an iteration (fetches the schedule at a round's start)."""
        timing = self._expect(
            _HookState.NEED_SCHEDULE, _HookState.BETWEEN_STEPS, call="on_step_begin"
        )
        if self._state is _HookState.NEED_SCHEDULE:
            self._fetch_schedule()
            self._step_in_round = 0
            self._record = RoundRecord(self.round, self._write_trace)
        self._record.start_step()
        self._schedule.start_step()
        self._state = _HookState.IN_STEP
        timing.step_begin(self._record, first=self._step_in_round == 0)

    @_device_errors
    def on_instruction_begin(
        self, name: str, *, stage: int | None = None, microbatch: int | None = None
    ) -> None:
        """Mark the beginning of instruction `name` (an instruction kind: "forward",
        "backward", "backward_input" or "backward_weight"); sets its clock.

        `stage` and `microbatch` (optional) say which pipeline stage and microbatch it
        computes: they go to the trace, and `stage` picks a stage's own nominal time in
        nominal emulation.
        """
        timing = self._expect(_HookState.IN_STEP, call="on_instruction_begin")
        freq = self._schedule.begin(name, self.step)
        self._state = _HookState.IN_INSTRUCTION
        timing.instruction_begin(name, freq, stage, microbatch)

    @_device_errors
    def on_instruction_end(
        self, name: str, *, stage: int | None = None, microbatch: int | None = None
    ) -> None:
        """Mark the end of instruction `name`: measure (and, emulated, stretch) it.

        `stage`/`microbatch` default to those given to `on_instruction_begin`.
        """
        timing = self._expect(_HookState.IN_INSTRUCTION, call="on_instruction_end")
        freq = self._schedule.end(name, self.step)
        timing.instruction_end(
            self._record,
            name=name,
            freq_mhz=freq,
            index=self._schedule.index,
            step=self.step,
            stage=stage,
            microbatch=microbatch,
        )
        self._schedule.advance()
        self._state = _HookState.IN_STEP

    @_device_errors
    def on_step_end(self) -> None:
        """Mark the end of an iteration; reports the round's results after its last step."""
        timing = self._expect(_HookState.IN_STEP, call="on_step_end")
        self._schedule.finish_step(self.step)
        timing.step_end(self._record, step=self.step, slot=self._step_in_round)
        self.step += 1
        self._step_in_round += 1
        if self._step_in_round < self._round_steps:
            self._state = _HookState.BETWEEN_STEPS
            return
        record = self._record
        timing.round_end(record)
        # close_round spreads the round's mean power between its first and last refresh
        # over its steps: reads at a step's ends lag by up to a refresh period each.
        windows = self._gpu.close_round(record, len(self._schedule.frequencies))
        result = record.result(self.rank, windows)
        self._savings.measured(record.iter_time, record.iter_energy)
        self._state = _HookState.NEED_SCHEDULE
        # Reporting and the next schedule's long-poll run off the training thread; the
        # next on_step_begin collects the schedule (and any error) from it.
        self._pending = self._exchange.start(result, self.round + 1)

    @_device_errors
    def abort_step(self) -> None:
        """Forget the step in progress after the training step failed: its instructions'
        measurements are dropped and the next `on_step_begin` starts the step again (same
        schedule, same round). Does nothing between steps."""
        if self._state not in (_HookState.IN_STEP, _HookState.IN_INSTRUCTION):
            return
        self._record.drop_step()
        if self._timing is not None:
            self._timing.discard()
        self._schedule.start_step()
        self._state = _HookState.BETWEEN_STEPS
        logger.warning(
            "Rank %d: step %d failed; its measurements are dropped", self.rank, self.step
        )

    def _fetch_schedule(self) -> None:
        pending, self._pending = self._pending, None
        handed, schedule = self._exchange.collect(pending, self.round + 1, dp_rank=self.dp_rank)
        frequencies = self._schedule.accept(schedule, self.round + 1)
        self._round_steps = max(self.steps_per_round, schedule.steps or 0)
        self.round += 1
        if schedule.status is not None:
            self.status = schedule.status
        self._savings.schedule(self.round, [f for _, f in schedule.frequencies])
        fanout = self._fanout
        group = fanout.is_leader and len(fanout.members) > 1  # the trace shows what it got
        self._write_trace(
            schedule_record(
                self.round,
                self.step,
                frequencies,
                leader=fanout.leader,
                handed=handed if group else None,
            )
        )

    # ------------------------------------------------------------------ lifecycle
    @_device_errors
    def close(self, *, finish: bool = True) -> None:
        """Stop the hook's threads, restore the GPU's clocks, close the HTTP client.
        `finish` (a normal end): every rank waits for the others (at most twice `timeout_s`),
        then the first leader tells the coordinator (`perseus.client.wire.finish`); a finish that
        cannot be told is a warning. ``finish=False`` (training failed) tells the coordinator
        nothing: the job fails at its round timeout. Idempotent."""
        if self._state is _HookState.CLOSED:
            return
        connected = self._timing is not None
        self._state = _HookState.CLOSED
        self._savings.log_saving()
        pending, self._pending = self._pending, None
        try:
            if connected:
                self._exchange.wait_reported(pending, self.timeout_s)
            self._gpu.stop()
            if finish and connected:
                self.finish_report = finish_job(
                    self._dist,
                    self._coordinator,
                    job_id=self.job_id,
                    rank=self.rank,
                    registrar=self._fanout.registrar,
                    world_size=self.world_size,
                    timeout_s=2 * self.timeout_s,
                    status=self.status,
                )
                self._exchange.wait_ended(pending, 2 * self.timeout_s)
        finally:
            self._release()

    def _release(self) -> None:
        """Close what connect opened: the coordinator's client, the trace, the meter."""
        self._coordinator.close()
        self._gpu.stop()
        self._timing = None
        if self._trace is not None:
            self._trace.close()
            self._trace = None
