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
long-poll barrier over all ranks of the job); the next `on_step_begin` collects it, and any
error the exchange met. The very first schedule is fetched in-band. Each instruction's
frequency is handed to a background thread (one worker, a queue) that locks the GPU's SM
clock, so the training loop never waits on the driver; each instruction's time and energy
are measured around a device synchronisation, energy with the GPU's energy counter. With an
`EmulatedGPU`, the hook also stretches instructions to the locked clock and takes each
instruction's energy from the emulator: exactly what it added to the energy counter (see
`perseus.emulation`); iteration energies always come from the counter.

States (`_State`), and the calls that move between them (anything else is a `RankError`):

```
NEED_SCHEDULE --on_step_begin (fetches the schedule)--> IN_STEP
BETWEEN_STEPS --on_step_begin--> IN_STEP
IN_STEP --on_instruction_begin--> IN_INSTRUCTION --on_instruction_end--> IN_STEP
IN_STEP --on_step_end--> BETWEEN_STEPS, or NEED_SCHEDULE after the round's last step (reports)
any --close--> CLOSED
```

This module imports neither the solver nor the server: data flows one way.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import httpx

from perseus.emulation import EmulationSettings, InstructionEmulator
from perseus.errors import (
    ConfigurationError,
    CoordinatorError,
    JobNotFoundError,
    RankError,
    ScheduleError,
)
from perseus.protocol import (
    GET_SCHEDULE_URL,
    INSTRUCTIONS,
    REGISTER_JOB_URL,
    REGISTER_RANK_URL,
    REPORT_RESULT_URL,
    STRAGGLER_URL,
    FrequencySchedule,
    JobInfo,
    ProfilingResult,
    RankInfo,
)
from zeus_power.device.base import GPU
from zeus_power.device.emulated import EmulatedGPU

__all__ = ["FrequencyController", "PerseusOptimizer"]

logger = logging.getLogger(__name__)

TRACE_DIR_ENV = "PERSEUS_TRACE_DIR"
"""Environment variable: a directory where each rank writes ``rank{R}.jsonl`` (see `trace`)."""


class _State(enum.Enum):
    NEED_SCHEDULE = "waiting for the next round's schedule"
    BETWEEN_STEPS = "between two steps of a round"
    IN_STEP = "inside a step"
    IN_INSTRUCTION = "inside an instruction"
    CLOSED = "closed"


class FrequencyController:
    """Applies SM clocks to a GPU from one background thread, in request order.

    `request` never blocks; consecutive requests that pile up are coalesced (only the newest
    is applied). An error raised by the GPU is re-raised in the caller's thread on the next
    `request`, `wait_applied` or `close`. `close` always resets the GPU's clocks once any
    clock was requested.
    """

    def __init__(self, gpu: GPU) -> None:
        self.gpu = gpu
        self._queue: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._cond = threading.Condition()
        self._requested = 0
        self._applied = 0
        self._last_requested_mhz: int | None = None
        self._error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(
            target=self._run, name=f"perseus-freq-gpu{gpu.index}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            latest = item
            taken = 1
            with contextlib.suppress(queue.Empty):
                while latest is not None:
                    latest = self._queue.get_nowait()
                    taken += 1
            if latest is not None:
                try:
                    self.gpu.lock_sm_clocks(latest, latest)
                except BaseException as exc:  # re-raised in the training thread
                    with self._cond:
                        self._error = exc
            with self._cond:
                self._applied += taken
                self._cond.notify_all()
            if latest is None:
                return

    def _raise_pending(self) -> None:
        if self._error is None:
            return  # fast path; the worker sets it under the lock, and we re-check under it
        with self._cond:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def request(self, freq_mhz: int) -> None:
        """Ask for `freq_mhz` to be locked (no-op if it was the last one requested)."""
        self._raise_pending()
        if self._closed:
            raise RankError("The frequency controller is closed")
        if freq_mhz == self._last_requested_mhz:
            return
        self._last_requested_mhz = freq_mhz
        with self._cond:
            self._requested += 1
        self._queue.put(freq_mhz)

    def wait_applied(self, timeout_s: float = 5.0) -> None:
        """Block until every request so far has been applied (used by the emulator only)."""
        if self._applied >= self._requested and self._error is None:
            return  # fast path: nothing in flight (both counters only grow)
        with self._cond:
            target = self._requested
            if not self._cond.wait_for(lambda: self._applied >= target, timeout=timeout_s):
                raise RankError(
                    f"GPU {self.gpu.index}: a clock change did not complete within {timeout_s} s"
                )
        self._raise_pending()

    def close(self) -> None:
        """Stop the worker and reset the GPU's SM clocks (always, even after an error)."""
        if self._closed:
            return
        self._closed = True
        with self._cond:
            self._requested += 1
        self._queue.put(None)
        self._thread.join(timeout=10.0)
        try:
            if self._last_requested_mhz is not None:  # we may have changed the clock
                self.gpu.reset_sm_clocks()
        finally:
            self._raise_pending()


def _default_sync(device_id: int) -> Callable[[], None]:
    """A device synchronisation: CUDA's when torch sees a GPU, else nothing to wait for."""
    try:
        import torch
    except ImportError:
        return lambda: None
    if torch.cuda.is_available():
        return lambda: torch.cuda.synchronize(device_id)
    return lambda: None


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

    def result(self) -> Any:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value


class PerseusOptimizer:
    """The per-rank Perseus hook (constructor as Zeus's `PipelineFrequencyOptimizer`).

    Needs an initialised `torch.distributed` process group spanning the job: rank 0
    registers the job and broadcasts its id; every rank then registers its `RankInfo`.

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
        emulation: Emulation mode with an `EmulatedGPU` (default: from ``PERSEUS_EMULATE_*``).
        nominal_time_s: Instruction name → nominal time at the max clock (nominal emulation).
        expected_instructions: This stage's instruction names for one iteration, in
            execution order; a schedule that differs is rejected as soon as it arrives.
        trace_dir: Write ``rank{R}.jsonl`` here (default: ``PERSEUS_TRACE_DIR``, if set).
        sync: Device synchronisation before each measurement (default: CUDA's, if any).
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
    ) -> None:
        self._state = _State.CLOSED  # until construction succeeds
        self._check_layout(
            rank, dp_rank, pp_rank, tp_rank, dp_degree, pp_degree, tp_degree, world_size
        )
        for name, value in (("timeout_s", timeout_s), ("round_timeout_s", round_timeout_s)):
            if not (math.isfinite(value) and value > 0):
                raise ConfigurationError(f"{name}={value!r} must be a positive number of seconds")
        if steps_per_round < 1:
            raise ConfigurationError(f"steps_per_round={steps_per_round!r} must be at least 1")
        if not server_url.startswith(("http://", "https://")):
            raise ConfigurationError(
                f"server_url={server_url!r} must be an http(s) URL, e.g. http://127.0.0.1:7787"
            )
        self.rank, self.dp_rank, self.pp_rank, self.tp_rank = rank, dp_rank, pp_rank, tp_rank
        self.device_id = device_id
        self.dp_degree, self.pp_degree, self.tp_degree = dp_degree, pp_degree, tp_degree
        self.world_size = world_size
        self.server_url = server_url.rstrip("/")
        self.steps_per_round = steps_per_round
        self.timeout_s = float(timeout_s)
        self.round_timeout_s = float(round_timeout_s)
        self.expected_instructions = (
            list(expected_instructions) if expected_instructions is not None else None
        )
        self._dist = self._process_group(rank, world_size)

        if gpu is None:
            from zeus_power.device import open_gpus

            gpu = open_gpus([device_id])[0]
        self.gpu = gpu
        self._sync = sync if sync is not None else _default_sync(device_id)
        self.emulator: InstructionEmulator | None = None
        if isinstance(gpu, EmulatedGPU):
            self.emulator = InstructionEmulator(
                gpu, emulation or EmulationSettings(), nominal_time_s=nominal_time_s
            )
        self._energy_counter = gpu.supports_energy_counter()
        self.available_frequencies = sorted(gpu.supported_sm_clocks_mhz(), reverse=True)

        self._http = httpx.Client(
            base_url=self.server_url,
            timeout=httpx.Timeout(self.timeout_s),
            headers={"user-agent": "perseus-client"},
        )
        self._trace: IO[str] | None = None
        self._freq: FrequencyController | None = None
        try:
            self.job_id = self._register_job(job_metadata)
            self._post(
                REGISTER_RANK_URL.format(job_id=self.job_id),
                RankInfo(
                    rank=rank,
                    dp_rank=dp_rank,
                    pp_rank=pp_rank,
                    tp_rank=tp_rank,
                    available_frequencies=self.available_frequencies,
                ),
            )
            trace = trace_dir if trace_dir is not None else os.environ.get(TRACE_DIR_ENV)
            if trace:
                path = Path(trace) / f"rank{rank}.jsonl"
                path.parent.mkdir(parents=True, exist_ok=True)
                self._trace = path.open("w", buffering=1)
                self._write_trace({"kind": "job", "job_id": self.job_id, "rank": rank})
            self._freq = FrequencyController(gpu)
        except BaseException:
            self._http.close()
            if self._trace is not None:
                self._trace.close()
            raise

        self._state = _State.NEED_SCHEDULE
        self._pending: _Exchange | None = None
        self._reported = threading.Event()
        self._schedule: list[tuple[str, int]] = []
        self.round = -1
        self.step = 0
        self._step_in_round = 0
        self._instr_index = 0
        self._instr_start_s = 0.0
        self._instr_start_mj = 0.0
        self._step_start_s = 0.0
        self._step_start_mj = 0.0
        self._iter_time: list[float] = []
        self._iter_energy: list[float] = []
        self._time_breakdown: dict[str, list[list[float]]] = {}
        self._energy_breakdown: dict[str, list[list[float]]] = {}

    # ------------------------------------------------------------------ setup helpers
    @staticmethod
    def _check_layout(
        rank: int,
        dp_rank: int,
        pp_rank: int,
        tp_rank: int,
        dp_degree: int,
        pp_degree: int,
        tp_degree: int,
        world_size: int,
    ) -> None:
        for name, value in (("dp_degree", dp_degree), ("pp_degree", pp_degree)):
            if value < 1:
                raise ConfigurationError(f"{name}={value!r} must be at least 1")
        if tp_degree < 1:
            raise ConfigurationError(f"tp_degree={tp_degree!r} must be at least 1")
        if dp_degree * pp_degree * tp_degree != world_size:
            raise ConfigurationError(
                f"dp_degree·pp_degree·tp_degree = {dp_degree}·{pp_degree}·{tp_degree} != "
                f"world_size {world_size}"
            )
        for name, value, bound in (
            ("rank", rank, world_size),
            ("dp_rank", dp_rank, dp_degree),
            ("pp_rank", pp_rank, pp_degree),
            ("tp_rank", tp_rank, tp_degree),
        ):
            if not 0 <= value < bound:
                raise ConfigurationError(f"{name}={value!r} must be in [0, {bound})")

    @staticmethod
    def _process_group(rank: int, world_size: int) -> Any:
        try:
            import torch.distributed as dist
        except ImportError as exc:
            raise ConfigurationError(
                "PerseusOptimizer needs PyTorch: pip install 'perseus-energy[torch]'"
            ) from exc
        if not (dist.is_available() and dist.is_initialized()):
            raise ConfigurationError(
                "PerseusOptimizer needs an initialised torch.distributed process group: call "
                "torch.distributed.init_process_group(...) before constructing it"
            )
        if dist.get_rank() != rank or dist.get_world_size() != world_size:
            raise ConfigurationError(
                f"rank={rank}, world_size={world_size} do not match the process group "
                f"(rank {dist.get_rank()} of {dist.get_world_size()})"
            )
        return dist

    def _broadcast_text(self, ok: bool, text: str) -> tuple[bool, str]:
        """Broadcast (ok, text) from rank 0 as plain tensors (no pickling)."""
        import torch

        dist = self._dist
        device = torch.device("cpu")
        if dist.get_backend() == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
        data = text.encode() if self.rank == 0 else b""
        header = torch.tensor([int(ok), len(data)], dtype=torch.int64, device=device)
        dist.broadcast(header, src=0)
        ok_flag, length = (int(x) for x in header.tolist())
        payload = torch.zeros(max(length, 1), dtype=torch.uint8, device=device)
        if self.rank == 0 and length:
            payload[:length] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
        dist.broadcast(payload, src=0)
        return bool(ok_flag), bytes(payload[:length].cpu().tolist()).decode()

    def _register_job(self, job_metadata: str | None) -> str:
        """Rank 0 registers the job; every rank learns the id (or rank 0's error)."""
        if self.rank == 0:
            try:
                job_info = JobInfo(
                    pp_degree=self.pp_degree,
                    dp_degree=self.dp_degree,
                    tp_degree=self.tp_degree,
                    world_size=self.world_size,
                    job_metadata=job_metadata,
                )
                job_id = self._post(REGISTER_JOB_URL, job_info)
                if not isinstance(job_id, str) or not job_id:
                    raise CoordinatorError(
                        f"The Perseus coordinator at {self.server_url} answered "
                        f"{REGISTER_JOB_URL} with {job_id!r} instead of a job id",
                        url=self.server_url + REGISTER_JOB_URL,
                    )
            except BaseException as exc:
                with contextlib.suppress(Exception):
                    self._broadcast_text(False, str(exc))
                raise
            self._broadcast_text(True, job_id)
            return job_id
        ok, text = self._broadcast_text(False, "")
        if not ok:
            raise CoordinatorError(f"Rank 0 could not register the job: {text}")
        return text

    # ------------------------------------------------------------------ HTTP
    def _request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        url = f"{self.server_url}{path}"
        timeout = self.timeout_s if timeout_s is None else timeout_s
        content = None
        if body is not None:
            content = (
                body.model_dump_json() if hasattr(body, "model_dump_json") else json.dumps(body)
            )
        try:
            response = self._http.request(
                method,
                path,
                content=content,
                params=params,
                headers={"content-type": "application/json"} if content is not None else None,
                timeout=httpx.Timeout(self.timeout_s, read=timeout),
            )
        except httpx.ConnectError as exc:
            raise CoordinatorError(
                f"Cannot reach the Perseus coordinator at {self.server_url}: {exc}. "
                "Is it running (perseus serve) and is the URL right?",
                url=url,
            ) from exc
        except httpx.TimeoutException as exc:
            raise CoordinatorError(
                f"The Perseus coordinator at {self.server_url} did not answer {method} {path} "
                f"within {timeout:g} s ({type(exc).__name__})",
                url=url,
            ) from exc
        except httpx.HTTPError as exc:
            raise CoordinatorError(
                f"{method} {url} failed: {type(exc).__name__}: {exc}", url=url
            ) from exc
        if response.is_success:
            try:
                return response.json()
            except ValueError as exc:
                raise CoordinatorError(
                    f"The Perseus coordinator at {url} answered {response.status_code} with "
                    f"a body that is not JSON: {response.text[:200]!r}",
                    url=url,
                    status_code=response.status_code,
                ) from exc
        try:
            detail = response.json().get("detail", response.text)
        except (ValueError, AttributeError):
            detail = response.text[:500]
        if not isinstance(detail, str):
            detail = json.dumps(detail)
        error = JobNotFoundError if response.status_code == 404 else CoordinatorError
        raise error(
            f"The Perseus coordinator at {url} answered {response.status_code} "
            f"{response.reason_phrase}: {detail}",
            url=url,
            status_code=response.status_code,
        )

    def _post(self, path: str, body: Any) -> Any:
        return self._request("POST", path, body=body)

    def announce_straggler(self, dp_rank: int, slowdown: float) -> None:
        """Tell the coordinator that pipeline `dp_rank` runs `slowdown` times slower (1.0: recovered)."""
        if not (0 <= dp_rank < self.dp_degree):
            raise ConfigurationError(f"dp_rank={dp_rank!r} must be in [0, {self.dp_degree})")
        if not (math.isfinite(slowdown) and slowdown >= 1.0):
            raise ConfigurationError(f"slowdown={slowdown!r} must be a number >= 1.0")
        self._post(
            STRAGGLER_URL.format(job_id=self.job_id), {"dp_rank": dp_rank, "slowdown": slowdown}
        )

    # ------------------------------------------------------------------ measurement
    def _energy_mj(self) -> float:
        if self._energy_counter:
            return float(self.gpu.total_energy_mj())
        return 0.0

    def _energy_since(self, start_mj: float, duration_s: float) -> float:
        """Joules since a counter reading (or power × time on GPUs without a counter)."""
        if self._energy_counter:
            return (self._energy_mj() - start_mj) / 1000.0
        return self.gpu.power_usage_mw() / 1000.0 * duration_s

    def _write_trace(self, record: dict[str, Any]) -> None:
        if self._trace is not None:
            self._trace.write(json.dumps(record) + "\n")

    def _expect(self, *states: _State, call: str) -> None:
        if self._state not in states:
            raise RankError(
                f"Rank {self.rank}: {call}() called {self._state.value}; expected "
                + " or ".join(s.value for s in states)
            )

    # ------------------------------------------------------------------ schedule
    def _get_schedule(self) -> Any:
        return self._request(
            "GET",
            GET_SCHEDULE_URL.format(job_id=self.job_id),
            params={"rank": self.rank},
            timeout_s=self.round_timeout_s,
        )

    def _exchange(self, result: ProfilingResult) -> Any:
        """Report a round and ask for the next schedule (runs on the exchange thread)."""
        try:
            self._post(REPORT_RESULT_URL.format(job_id=self.job_id), result)
        finally:
            self._reported.set()
        return self._get_schedule()

    def _fetch_schedule(self) -> None:
        exchange, self._pending = self._pending, None
        raw = exchange.result() if exchange is not None else self._get_schedule()
        try:
            schedule = FrequencySchedule.model_validate(raw)
        except ValueError as exc:
            raise CoordinatorError(
                f"The Perseus coordinator at {self.server_url} sent rank {self.rank} an invalid "
                f"schedule: {exc}",
                url=self.server_url,
            ) from None
        self._check_schedule(schedule)
        self._schedule = [(name, int(freq)) for name, freq in schedule.frequencies]
        self.round += 1
        self._write_trace(
            {
                "kind": "schedule",
                "round": self.round,
                "step": self.step,
                "frequencies": self._schedule,
            }
        )

    def _check_schedule(self, schedule: FrequencySchedule) -> None:
        where = f"Rank {self.rank} (stage {self.pp_rank}), round {self.round + 1}"
        if schedule.rank != self.rank:
            raise ScheduleError(f"{where}: received the schedule of rank {schedule.rank}")
        if not schedule.frequencies:
            raise ScheduleError(f"{where}: received an empty schedule")
        allowed = set(self.available_frequencies)
        for k, (name, freq) in enumerate(schedule.frequencies):
            if name not in INSTRUCTIONS:
                raise ScheduleError(
                    f"{where}: schedule entry #{k} names instruction {name!r}; "
                    f"expected one of {', '.join(INSTRUCTIONS)}"
                )
            if freq not in allowed:
                raise ScheduleError(
                    f"{where}: schedule entry #{k} asks for {freq} MHz, which this GPU does not "
                    f"support ({min(allowed)}..{max(allowed)} MHz)"
                )
        expected = self.expected_instructions
        if expected is not None:
            names = [name for name, _ in schedule.frequencies]
            if len(names) != len(expected):
                raise ScheduleError(
                    f"{where}: the schedule has {len(names)} instruction(s) per iteration but "
                    f"this stage executes {len(expected)}; the scheduler's pipeline schedule "
                    "(num_microbatches, stages) does not match the training job"
                )
            for k, (got, want) in enumerate(zip(names, expected, strict=True)):
                if got != want:
                    raise ScheduleError(
                        f"{where}: schedule entry #{k} is {got!r} but this stage executes "
                        f"{want!r} there"
                    )

    # ------------------------------------------------------------------ the hook
    def on_step_begin(self) -> None:
        """Mark the beginning of an iteration (fetches the schedule at a round's start)."""
        self._expect(_State.NEED_SCHEDULE, _State.BETWEEN_STEPS, call="on_step_begin")
        if self._state is _State.NEED_SCHEDULE:
            self._fetch_schedule()
            self._step_in_round = 0
            self._iter_time, self._iter_energy = [], []
            self._time_breakdown = {name: [] for name in INSTRUCTIONS}
            self._energy_breakdown = {name: [] for name in INSTRUCTIONS}
        for name in INSTRUCTIONS:
            self._time_breakdown[name].append([])
            self._energy_breakdown[name].append([])
        self._instr_index = 0
        self._state = _State.IN_STEP
        self._sync()
        self._step_start_mj = self._energy_mj()
        self._step_start_s = time.perf_counter()

    def on_instruction_begin(self, name: str) -> None:
        """Mark the beginning of instruction `name` ("forward"/"backward"); sets its clock."""
        self._expect(_State.IN_STEP, call="on_instruction_begin")
        k = self._instr_index
        if k >= len(self._schedule):
            raise ScheduleError(
                f"Rank {self.rank} (stage {self.pp_rank}), step {self.step}: instruction #{k} "
                f"({name!r}) exceeds the schedule, which has {len(self._schedule)} instruction(s) "
                "per iteration"
            )
        scheduled, freq = self._schedule[k]
        if name != scheduled:
            raise ScheduleError(
                f"Rank {self.rank} (stage {self.pp_rank}), step {self.step}: executed {name!r} as "
                f"instruction #{k} but the schedule says {scheduled!r}"
            )
        assert self._freq is not None
        self._freq.request(freq)
        self._state = _State.IN_INSTRUCTION
        self._sync()
        if self.emulator is None:
            self._instr_start_mj = self._energy_mj()
        self._instr_start_s = time.perf_counter()

    def on_instruction_end(self, name: str) -> None:
        """Mark the end of instruction `name`: measure (and, emulated, stretch) it."""
        self._expect(_State.IN_INSTRUCTION, call="on_instruction_end")
        scheduled, freq = self._schedule[self._instr_index]
        if name != scheduled:
            raise ScheduleError(
                f"Rank {self.rank}, step {self.step}: on_instruction_end({name!r}) does not match "
                f"on_instruction_begin({scheduled!r})"
            )
        self._sync()
        if self.emulator is not None:
            compute_end_s = time.perf_counter()
            assert self._freq is not None
            self._freq.wait_applied()
            freq = self.gpu.current_sm_clock_mhz()  # type: ignore[attr-defined]
            duration_s = self.emulator.finish(
                name, self._instr_start_s, freq, compute_end_s=compute_end_s
            )
            # Exactly what the emulated GPU's counter gained for this instruction (reading
            # the counter around it would add the idle power of the host's late wake-up).
            energy_j = self.emulator.last_energy_j
        else:
            duration_s = time.perf_counter() - self._instr_start_s
            energy_j = self._energy_since(self._instr_start_mj, duration_s)
        self._time_breakdown[name][-1].append(duration_s)
        self._energy_breakdown[name][-1].append(energy_j)
        if self._trace is not None:
            record = {
                "kind": "instruction",
                "round": self.round,
                "step": self.step,
                "index": self._instr_index,
                "instruction": name,
                "freq_mhz": freq,
                "time_s": duration_s,
                "energy_j": energy_j,
            }
            if self.emulator is not None:
                record["compute_s"] = self.emulator.last_compute_s
            self._write_trace(record)
        self._instr_index += 1
        self._state = _State.IN_STEP

    def on_step_end(self) -> None:
        """Mark the end of an iteration; reports the round's results after its last step."""
        self._expect(_State.IN_STEP, call="on_step_end")
        self._sync()
        iter_time_s = time.perf_counter() - self._step_start_s
        iter_energy_j = self._energy_since(self._step_start_mj, iter_time_s)
        if self._instr_index != len(self._schedule):
            raise ScheduleError(
                f"Rank {self.rank} (stage {self.pp_rank}), step {self.step}: executed "
                f"{self._instr_index} instruction(s) but the schedule has {len(self._schedule)} "
                "per iteration"
            )
        self._iter_time.append(iter_time_s)
        self._iter_energy.append(iter_energy_j)
        self._write_trace(
            {
                "kind": "step",
                "round": self.round,
                "step": self.step,
                "iter_time_s": iter_time_s,
                "iter_energy_j": iter_energy_j,
            }
        )
        self.step += 1
        self._step_in_round += 1
        if self._step_in_round < self.steps_per_round:
            self._state = _State.BETWEEN_STEPS
            return
        result = ProfilingResult(
            rank=self.rank,
            iter_time=self._iter_time,
            iter_energy=self._iter_energy,
            time_breakdown=self._time_breakdown,
            energy_breakdown=self._energy_breakdown,
        )
        self._state = _State.NEED_SCHEDULE
        # Reporting and the next schedule's long-poll run off the training thread; the
        # next on_step_begin collects the schedule (and any error) from it.
        self._reported.clear()
        self._pending = _Exchange(self._exchange, result, name=f"perseus-round-rank{self.rank}")

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Stop the frequency worker, restore the GPU's clocks, close the HTTP client."""
        if self._state is _State.CLOSED and self._freq is None:
            return
        self._state = _State.CLOSED
        pending, self._pending = self._pending, None
        if pending is not None and not self._reported.wait(self.timeout_s):
            logger.warning(
                "Rank %d: the last round's report did not reach the coordinator", self.rank
            )
        try:
            if self._freq is not None:
                freq, self._freq = self._freq, None
                freq.close()
        finally:
            self._http.close()
            if self._trace is not None:
                self._trace.close()
                self._trace = None

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
            self.close()
        except Exception as close_exc:
            logger.warning(
                "Rank %d: closing the Perseus hook also failed: %s", self.rank, close_exc
            )
