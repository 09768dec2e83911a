"""Simulated ranks for `bench_sensors.py` and `bench_profile_fidelity.py`: one pipeline on
emulated GPUs with given sensors.

A rank runs its schedule's iterations as the pipeline's DAG orders them, tells its GPU
each instruction's power as the hook's emulation does, reads the counter at iteration
boundaries and polls it as `perseus.client.gpu.sensing.CounterPoller` does, in virtual time;
what it reports is exactly what a rank would (see `bench_sensors.py`'s docstring). What
each (stage, kind, clock) takes and draws is a `Truth`: the DVFS model's (`dvfs_truth`)
or any other curves (`bench_profile_fidelity.py` draws them around the published A40
profiles). Each execution's time may be jittered (the GPU's own timing reports the jittered
time); the GPUs may drift and their power may decay after work stops (`EmulatedGPU`'s).
Clock changes may take time (`switch_latency_s`: asked for when an instruction begins, as
the hook does, a change lands that many seconds of wall time later, bubbles and P2P waits
included; the work before it runs at the clock in force, as on the emulated GPU) and each
P2P hop between ranks may add `hop_latency_s`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from perseus.client.gpu.rounds import idle_before_s
from perseus.client.gpu.sensing import Tick, energy_windows
from perseus.client.settings import EmulationSettings
from perseus.domain.profile import InstructionProfile
from perseus.domain.schedule import PipelineSchedule
from perseus.protocol import FrequencySchedule, JobInfo, PipelineSpec, ProfilingResult, RankInfo
from zeus_power.device import EmulatedGPU, SensorSpec, VirtualClock

GPU_TYPE = "A100-SXM"
Truth = Callable[[int, str, int], tuple[float, float]]
"""(stage, kind, clock MHz) → (time s, busy power W) of one instruction, before any sensor."""
STAGE_WORK = (1.0 / 1.6, 1.0, 1.3 / 1.6, 0.7 / 1.6)
POLL_S = 0.0024
"""The simulated poller reads about back to back, one read's latency apart (2.4 ms on an
H100, ±30 %)."""
STEP_GAP_S = 0.0003
"""Host time between two iterations (the hook's counter reads, the training loop)."""
EXCHANGE_S = 0.02
"""Idle time between two rounds (the rank reports and fetches its next schedule)."""


class Ranks:
    """Simulated ranks of one pipeline on emulated GPUs with the given sensors."""

    def __init__(
        self,
        schedule: PipelineSchedule,
        truth: Truth,
        sensors: SensorSpec,
        *,
        seed: int,
        gpu_type: str = GPU_TYPE,
        frequencies: Sequence[int] | None = None,
        jitter: float = 0.0,
        gpu_options: dict[str, Any] | None = None,
        exact_breakdown: bool = False,
        switch_latency_s: float = 0.0,
        hop_latency_s: float = 0.0,
    ) -> None:
        self.schedule = schedule
        self._truth = truth
        self.switch_latency_s = switch_latency_s
        self.hop_latency_s = hop_latency_s
        self.jitter = jitter
        """Relative standard deviation of each execution's time around its truth."""
        self.exact_breakdown = exact_breakdown
        """Report each instruction's own energy (what the emulator handed the hook before
        it had sensors: the reference for today's profiler)."""
        self.sensors = sensors
        self.clocks = [VirtualClock() for _ in schedule.orders]
        self.gpus = [
            EmulatedGPU(
                r, gpu_type=gpu_type, clock=c, sensors=sensors, seed=seed, **(gpu_options or {})
            )
            for r, c in enumerate(self.clocks)
        ]
        model = self.gpus[0]
        self.frequencies = (
            list(frequencies) if frequencies is not None else model.supported_sm_clocks_mhz()
        )
        self._cache: dict[tuple[int, str, int], tuple[float, float]] = {}
        order = schedule.instructions()
        dag = schedule.dag()
        index = {ins: i for i, ins in enumerate(order)}
        self._order = order
        self._preds = [[index[p] for p in dag.predecessors(ins)] for ins in order]
        self._asked: list[int | None] = [None for _ in schedule.orders]
        """Per rank: the clock asked for last (None: the max, before any)."""
        self._before: list[int | None] = [None for _ in schedule.orders]
        """Per rank: the clock in force until `_lands`."""
        self._lands = [-np.inf for _ in schedule.orders]
        self._slot = {ins: k for r in schedule.orders for k, ins in enumerate(r)}
        self.poll_t = [0.0 for _ in schedule.orders]
        self.next_poll = [0.0 for _ in schedule.orders]
        self.prev = [(0.0, float(g.total_energy_mj())) for g in self.gpus]
        self.ticks: list[list[Tick]] = [[] for _ in schedule.orders]
        self.now_s = 0.0
        self.last_span_s = (0.0, 0.0)
        """The last round's span: its first step's start, its last step's end."""
        self.last_drawn_j = 0.0
        """The energy the GPUs drew over `last_span_s` (and the exchange before it),
        exactly: power after work stops and drift included (`EmulatedGPU.drawn_energy_j`)."""
        self._rng = np.random.default_rng(seed)
        self.idle_w = [self._measure_idle(r) for r in range(len(self.gpus))]
        """Each GPU's idle power as its rank measures it at start (`EnergyReader`): the
        counter's energy between its first and last refresh over 0.45 s, before any work."""

    def _measure_idle(self, r: int) -> float | None:
        self._poll_until(r, 0.45, continuous=self.sensors.period_s == 0)
        ticks = self.ticks[r]
        self.ticks[r] = ticks[-2:]
        if len(ticks) < 2 or ticks[-1].time_s <= ticks[0].time_s:
            return None
        return (
            (ticks[-1].energy_mj - ticks[0].energy_mj) / 1000 / (ticks[-1].time_s - ticks[0].time_s)
        )

    def truth(self, stage: int, kind: str, freq: int) -> tuple[float, float]:
        """(time s, energy J) of one instruction: the model, before any sensor."""
        key = (stage, kind, freq)
        hit = self._cache.get(key)
        if hit is None:
            t, p = self._truth(stage, kind, freq)
            hit = self._cache[key] = (t, p * t)
        return hit

    def truth_profile(self, keys: set[tuple[int, str, int]]) -> InstructionProfile:
        rows = [(s, k, f, *self.truth(s, k, f)) for s, k, f in sorted(keys)]
        frame = pd.DataFrame(rows, columns=["stage", "instruction", "frequency", "time", "energy"])
        return InstructionProfile.from_frame(frame, source="truth")

    def job_info(self, job_id: str) -> JobInfo:
        """The job as its ranks register it: one pipeline, a rank per pipeline stage."""
        return JobInfo(
            pp_degree=len(self.schedule.orders),
            dp_degree=1,
            tp_degree=1,
            world_size=len(self.schedule.orders),
            pipeline=PipelineSpec.of(self.schedule),
        ).model_copy(update={"job_id": job_id})

    def rank_infos(self) -> list[RankInfo]:
        return [
            RankInfo(
                rank=r,
                dp_rank=0,
                pp_rank=r,
                tp_rank=0,
                available_frequencies=self.frequencies,
                emulated=True,
                energy_refresh_s=self.sensors.period_s,
                idle_power_w=self.idle_w[r],
                switch_latency_s=self.switch_latency_s or None,
                power_limit_w=self.gpus[r].power_limit_w(),
            )
            for r in range(self.schedule.num_stages)
        ]

    # ------------------------------------------------------------------ one round
    def run(self, schedules: list[FrequencySchedule]) -> tuple[list[ProfilingResult], float]:
        """Every rank's result of one round and the job's true energy over it."""
        freqs = {s.rank: s.frequencies for s in schedules}
        steps = schedules[0].steps or 1
        events: list[list[tuple[float, int, str, tuple]]] = [[] for _ in self.schedule.orders]
        marks: list[list[float]] = [[] for _ in self.schedule.orders]
        intervals: list[list[tuple[int, float, float]]] = [[] for _ in self.schedule.orders]
        durations: list[list[list[tuple[str, float]]]] = [[] for _ in self.schedule.orders]
        start = max(self.now_s, 0.45) + EXCHANGE_S
        # Read before the round: a meter folds old work into one figure, after which it
        # can no longer tell the energy drawn up to a past time.
        drawn_before_j = sum(g.drawn_energy_j(start) for g in self.gpus)
        true_j = 0.0
        for _ in range(steps):
            finish = [0.0] * len(self._order)
            rank_free = [start] * len(self.schedule.orders)
            for r in range(len(self.schedule.orders)):
                marks[r].append(start)
                durations[r].append([])
            for i, ins in enumerate(self._order):
                k = self._slot[ins]
                kind, f = freqs[ins.rank][k]
                hops = [
                    finish[p] + (self.hop_latency_s if self._order[p].rank != ins.rank else 0.0)
                    for p in self._preds[i]
                ]
                begin = max([*hops, rank_free[ins.rank]])
                t, e = self._switching(ins.rank, ins.stage, kind, f, begin)
                if self.jitter:
                    scale = max(0.5, 1.0 + self.jitter * float(self._rng.standard_normal()))
                    t, e = t * scale, e * scale
                finish[i] = rank_free[ins.rank] = begin + t
                events[ins.rank].append((begin, 1, "begin", (e / t,)))
                events[ins.rank].append((begin + t, 0, "end", (t, e)))
                intervals[ins.rank].append((k, begin, begin + t))
                durations[ins.rank][-1].append((kind, t, e))
                true_j += e
            end = max(finish)
            for r in range(len(self.schedule.orders)):
                marks[r].append(end)
            start = end + STEP_GAP_S
        self.now_s = start
        self.last_span_s = (marks[0][0], end)
        results = []
        drawn_after_j = 0.0
        for r, gpu in enumerate(self.gpus):
            counter = self._replay(r, events[r], marks[r])
            drawn_after_j += gpu.drawn_energy_j(end)
            iter_time = [b - a for a, b in zip(marks[r][::2], marks[r][1::2], strict=True)]
            iter_energy = [
                max(0.0, (b - a) / 1000) for a, b in zip(counter[::2], counter[1::2], strict=True)
            ]
            tb: dict[str, list[list[float]]] = {}
            eb: dict[str, list[list[float]]] = {}
            for it, instrs in enumerate(durations[r]):
                power = iter_energy[it] / iter_time[it]
                for kind in sorted({k for k, _, _ in instrs}):
                    tb.setdefault(kind, []).append([t for k, t, _ in instrs if k == kind])
                    eb.setdefault(kind, []).append(
                        [
                            e if self.exact_breakdown else t * power
                            for k, t, e in instrs
                            if k == kind
                        ]
                    )
            windows = energy_windows(
                self.ticks[r],
                intervals[r],
                len(freqs[r]),
                start_s=marks[r][0],
                end_s=marks[r][-1],
                settle_s=self.switch_latency_s,  # as a rank does (`EnergyReader.close_round`)
            )
            self.ticks[r] = self.ticks[r][-2:]
            results.append(
                ProfilingResult(
                    rank=r,
                    iter_time=iter_time,
                    iter_energy=iter_energy,
                    time_breakdown=tb,
                    energy_breakdown=eb,
                    energy_windows=windows,
                    idle_before_s=idle_before_s(intervals[r]),
                )
            )
            idle = sum(iter_time) - sum(t for instrs in durations[r] for _, t, _ in instrs)
            true_j += idle * gpu.idle_power_w  # the model's figure, before decay or drift
        self.last_drawn_j = drawn_after_j - drawn_before_j
        return results, true_j

    def _switching(
        self, r: int, stage: int, kind: str, f: int, begin: float
    ) -> tuple[float, float]:
        """(time, energy) of an instruction of rank `r` at clock `f` that begins at `begin`
        (seconds of the job's time): a change asked for then lands `switch_latency_s` later,
        counted in time, not in the rank's busy seconds; until it lands the work runs at the
        clock in force before it (two clocks, as `EmulatedGPU` runs it)."""
        top = max(self.frequencies)
        if f != (self._asked[r] or top):
            in_force = self._before[r] if begin < self._lands[r] else self._asked[r]
            self._before[r], self._asked[r] = in_force, f
            self._lands[r] = begin + self.switch_latency_s
        lag = self._lands[r] - begin
        old = self._before[r] or top
        t, e = self.truth(stage, kind, f)
        if lag <= 0 or old == f:
            return t, e
        t_old, e_old = self.truth(stage, kind, old)
        if t_old <= lag:  # done before the change lands
            return t_old, e_old
        left = 1.0 - lag / t_old  # the share of the work still to do at the new clock
        return lag + left * t, e_old * lag / t_old + left * e

    def _replay(self, r: int, events: list, marks: list[float]) -> list[float]:
        """Run one rank's events on its GPU in virtual time, polling the counter; the
        counter's value at each mark."""
        gpu, clock = self.gpus[r], self.clocks[r]
        queue = list(events) + [(t, 2, "mark", (i,)) for i, t in enumerate(marks)]
        heapq.heapify(queue)
        values = [0.0] * len(marks)
        period = self.sensors.period_s
        while queue:
            t, _, what, args = heapq.heappop(queue)
            self._poll_until(r, t, continuous=period == 0)
            clock.advance(max(t - clock(), 0.0))
            if what == "begin":
                gpu.begin_busy(args[0])
            elif what == "end":
                gpu.end_busy(*args)
            else:
                values[args[0]] = float(gpu.total_energy_mj())
        return values

    def _poll_until(self, r: int, t: float, *, continuous: bool) -> None:
        gpu, clock = self.gpus[r], self.clocks[r]
        step = 0.02 if continuous else POLL_S
        while True:
            # Reads are not evenly spaced (the host schedules the poller): a refresh falls
            # anywhere within its bracket.
            if self.next_poll[r] <= self.poll_t[r]:
                self.next_poll[r] = self.poll_t[r] + step * float(self._rng.uniform(0.7, 1.3))
            if self.next_poll[r] > t:
                break
            self.poll_t[r] = self.next_poll[r]
            clock.advance(max(self.poll_t[r] - clock(), 0.0))
            v = float(gpu.total_energy_mj())
            prev_t, prev_v = self.prev[r]
            if continuous:
                self.ticks[r].append(Tick(self.poll_t[r], v))
            elif v != prev_v:
                width = self.poll_t[r] - prev_t
                self.ticks[r].append(Tick(0.5 * (prev_t + self.poll_t[r]), v, True, width))
            self.prev[r] = (self.poll_t[r], v)


def dvfs_truth(forward_ms: float, gpu_type: str = GPU_TYPE) -> Truth:
    """The emulator's own DVFS model with the hook's per-kind presets: stages
    1 : 1.6 : 1.3 : 0.7 (cycled), a backward twice its forward."""
    gpu = EmulatedGPU(0, gpu_type=gpu_type, clock=VirtualClock())
    emulation = EmulationSettings()
    work = {k: emulation.workload(k) for k in ("forward", "backward")}

    def truth(stage: int, kind: str, freq: int) -> tuple[float, float]:
        w = work["forward" if kind == "forward" else "backward"]
        base = forward_ms / 1000 * STAGE_WORK[stage % len(STAGE_WORK)]
        base *= 1 if kind == "forward" else 2
        return base * gpu.stretch_factor(w, freq), gpu.busy_power_w(w, freq)

    return truth
