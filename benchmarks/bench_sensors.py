"""Benchmark: profiling on what a GPU shows, against sensor refresh and instruction length.

Usage::

    python benchmarks/bench_sensors.py [--lengths sub-ms,ms,10ms] [--sensors ideal,100ms,100ms-25%]
        [--stages 4] [--microbatches 8] [--freq-step 4] [--seed 0] [--json out.json]

The online loop runs for real: the coordinator's `Perseus` scheduler (sweep → fit → solve →
deploy), driven round by round through `next_schedule` / `observe`, with simulated ranks in
virtual time. Each rank has an `EmulatedGPU` (A100) whose sensors are the ones under test:
``ideal`` (exact, continuous), ``100ms`` (the default: refresh every 100 ms, whole period
sampled, 1 % noise) or ``100ms-25%`` (only the last 25 % of each period sampled, arXiv
2312.02741). A rank runs its schedule's iterations as the pipeline's DAG orders them
(every instruction as soon as its predecessors are done), tells its GPU each instruction's
power as the hook's emulation does (`begin_busy` / `end_busy`, the DVFS model with the
GPT-3 per-kind preset), reads the counter at iteration boundaries as the hook does, and
polls it every 2.4 ms (one read's latency) as `perseus.client.sensing.CounterPoller` does;
its energy windows come from `perseus.client.sensing.energy_windows`. So the scheduler sees
exactly what a rank would report; the truth (the model's time and energy of every
(stage, kind, clock)) is known here and nowhere in the loop.

Instruction lengths (forward of the busiest stage at the max clock; backwards twice as long,
stages 1 : 1.6 : 1.3 : 0.7): ``sub-ms`` 0.6 ms, ``ms`` 3 ms, ``10ms`` 12 ms.

Two profilers, on the same sensors:

- **ours** (``estimator="windows"``): energies fitted to the counter's refreshes, rounds of
  ``round_ticks`` refreshes, options re-measured where their uncertainty could change the plan;
- **today's** (``estimator="breakdown"``, one iteration a round): each instruction's energy
  as the ranks report it, which on such sensors is its iteration's mean power times its time.

Per cell: rounds and seconds until deployed, the energy spent off plan (profiling rounds
minus the deployed plan for as many iterations), the profile's energy error against the
truth over every (stage, kind, clock) it holds (median / 95th percentile), the blocking
power's error, and the deployed plan scored on the truth against the truth's own best plan
at the same iteration time (same clocks available). The reference cost is today's profiler
on ideal sensors (exact per-instruction energies, which the emulator used to hand the hook).
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from perseus.client.emulation import EmulationSettings
from perseus.client.sensing import Tick, energy_windows
from perseus.domain.profile import InstructionProfile
from perseus.domain.schedule import PipelineSchedule, make_schedule
from perseus.errors import ProfileError
from perseus.planning import evaluate, solve_frontier
from perseus.protocol import FrequencySchedule, JobInfo, PipelineSpec, ProfilingResult, RankInfo
from perseus.settings import PerseusSettings
from schedulers.base import build_scheduler
from schedulers.perseus_scheduler import Perseus, PerseusPhase
from zeus_power.device import EmulatedGPU, SensorSpec, VirtualClock
from zeus_power.device.sensors import IDEAL_SENSORS

GPU_TYPE = "A100-SXM"
SENSORS = {
    "ideal": IDEAL_SENSORS,
    "100ms": SensorSpec(period_s=0.1, window=1.0, read_latency_s=0.0, noise=0.01),
    "100ms-25%": SensorSpec(period_s=0.1, window=0.25, read_latency_s=0.0, noise=0.01),
}
"""Read latency 0 here: in virtual time a read costs nothing; the poller reads every 2.4 ms."""
LENGTHS_MS = {"sub-ms": 0.6, "ms": 3.0, "10ms": 12.0}
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
        forward_ms: float,
        sensors: SensorSpec,
        *,
        seed: int,
        exact_breakdown: bool = False,
    ) -> None:
        self.schedule = schedule
        self.exact_breakdown = exact_breakdown
        """Report each instruction's own energy (what the emulator handed the hook before
        it had sensors: the reference for today's profiler)."""
        self.sensors = sensors
        self.clocks = [VirtualClock() for _ in schedule.orders]
        self.gpus = [
            EmulatedGPU(r, gpu_type=GPU_TYPE, clock=c, sensors=sensors, seed=seed)
            for r, c in enumerate(self.clocks)
        ]
        model = self.gpus[0]
        emulation = EmulationSettings()
        self.work = {k: emulation.workload(k) for k in ("forward", "backward")}
        self.base_s = {
            (s, k): forward_ms / 1000 * STAGE_WORK[s] * (1 if k == "forward" else 2)
            for s in range(schedule.num_stages)
            for k in ("forward", "backward")
        }
        self.frequencies = model.supported_sm_clocks_mhz()
        self._cache: dict[tuple[int, str, int], tuple[float, float]] = {}
        order = schedule.instructions()
        dag = schedule.dag()
        index = {ins: i for i, ins in enumerate(order)}
        self._order = order
        self._preds = [[index[p] for p in dag.predecessors(ins)] for ins in order]
        self._slot = {ins: k for r in schedule.orders for k, ins in enumerate(r)}
        self.poll_t = [0.0 for _ in schedule.orders]
        self.next_poll = [0.0 for _ in schedule.orders]
        self.prev = [(0.0, float(g.total_energy_mj())) for g in self.gpus]
        self.ticks: list[list[Tick]] = [[] for _ in schedule.orders]
        self.now_s = 0.0
        self._rng = np.random.default_rng(seed)

    def truth(self, stage: int, kind: str, freq: int) -> tuple[float, float]:
        """(time s, energy J) of one instruction: the model, before any sensor."""
        key = (stage, kind, freq)
        hit = self._cache.get(key)
        if hit is None:
            gpu = self.gpus[0]
            t = self.base_s[stage, kind] * gpu.stretch_factor(self.work[kind], freq)
            hit = self._cache[key] = (t, gpu.busy_power_w(self.work[kind], freq) * t)
        return hit

    def truth_profile(self, keys: set[tuple[int, str, int]]) -> InstructionProfile:
        rows = [(s, k, f, *self.truth(s, k, f)) for s, k, f in sorted(keys)]
        frame = pd.DataFrame(rows, columns=["stage", "instruction", "frequency", "time", "energy"])
        return InstructionProfile.from_frame(frame, source="truth")

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
        start = self.now_s + EXCHANGE_S
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
                t, e = self.truth(ins.stage, kind, f)
                begin = max([finish[p] for p in self._preds[i]] + [rank_free[ins.rank]])
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
        results = []
        for r, gpu in enumerate(self.gpus):
            counter = self._replay(r, events[r], marks[r])
            iter_time = [b - a for a, b in zip(marks[r][::2], marks[r][1::2], strict=True)]
            iter_energy = [
                max(0.0, (b - a) / 1000) for a, b in zip(counter[::2], counter[1::2], strict=True)
            ]
            tb: dict[str, list[list[float]]] = {}
            eb: dict[str, list[list[float]]] = {}
            for it, instrs in enumerate(durations[r]):
                power = iter_energy[it] / iter_time[it]
                for kind in ("forward", "backward"):
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
                )
            )
            idle = sum(iter_time) - sum(t for instrs in durations[r] for _, t, _ in instrs)
            true_j += idle * gpu.idle_power_w
        return results, true_j

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


@dataclass
class Cell:
    sensors: str
    length: str
    profiler: str
    rounds: int
    iterations: int
    seconds: float
    off_plan_energy_j: float
    err_median: float
    err_p95: float
    block_err: float
    plan_gap: float
    options: int
    wall_s: float
    failed: str | None = None
    held: bool = False
    """The scheduler kept all-max: a check of the profile or the plan failed."""


def run_cell(sensors_name: str, length: str, profiler: str, args: argparse.Namespace) -> Cell:
    schedule = make_schedule("1f1b", args.stages, args.microbatches)
    ranks = Ranks(
        schedule,
        LENGTHS_MS[length],
        SENSORS[sensors_name],
        seed=args.seed,
        exact_breakdown=profiler == "today's" and sensors_name == "ideal",
    )
    info = JobInfo(
        pp_degree=schedule.num_stages,
        dp_degree=1,
        tp_degree=1,
        world_size=schedule.num_stages,
        pipeline=PipelineSpec.of(schedule),
    ).model_copy(update={"job_id": f"bench-{sensors_name}-{length}-{profiler}"})
    sched_args: dict[str, object] = {"max_slowdown": 0.0, "freq_step": args.freq_step}
    if args.round_ticks is not None:
        sched_args["round_ticks"] = args.round_ticks
    if profiler == "today's":
        sched_args["estimator"] = "breakdown"
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        settings = PerseusSettings(scheduler="Perseus", scheduler_args=sched_args, dump_dir=tmp)
        scheduler = build_scheduler(Perseus, info, ranks.rank_infos(), settings, sched_args)
        assert isinstance(scheduler, Perseus)
        while True:
            try:
                schedules = scheduler.next_schedule()
            except ProfileError as exc:  # today's, when iterations see no refresh: 0 J rows
                return Cell(sensors_name, length, profiler, *([math.nan] * 10), failed=str(exc))
            if scheduler.phase is not PerseusPhase.PROFILING:
                break  # deployed, or all-max held (a profile or plan check failed)
            results, _ = ranks.run(schedules)
            scheduler.observe(results)
        report = json.loads(scheduler.job_dir.profiling.read_text())
    assert scheduler.profile is not None and scheduler.chosen is not None
    profile, plan = scheduler.profile, scheduler.chosen
    errors, keys = [], set()
    for stage, kind in profile:
        o = profile.options(stage, kind)
        for f, e in zip(o.freq_mhz, o.energy_j, strict=True):
            keys.add((stage, kind, int(f)))
            errors.append(abs(e / ranks.truth(stage, kind, int(f))[1] - 1))
    idle_w = ranks.gpus[0].idle_power_w
    truth = ranks.truth_profile(keys)
    mine = evaluate(truth, schedule, plan.stage_frequencies(), idle_w)
    best = solve_frontier(truth, schedule, p2p_power_w=idle_w).choose(
        deadline_s=mine.iteration_time_s
    )
    return Cell(
        sensors=sensors_name,
        length=length,
        profiler=profiler,
        rounds=report["rounds"],
        iterations=report["iterations"],
        seconds=report["seconds"],
        off_plan_energy_j=report.get("off_plan_energy_j") or 0.0,
        err_median=float(np.median(errors)),
        err_p95=float(np.percentile(errors, 95)),
        block_err=scheduler.p2p_power_w / idle_w - 1,
        plan_gap=mine.energy_j / best.energy_j - 1,
        options=len(errors),
        wall_s=time.perf_counter() - t0,
        held=scheduler.phase is PerseusPhase.ALL_MAX,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", default=",".join(LENGTHS_MS))
    parser.add_argument("--sensors", default=",".join(SENSORS))
    parser.add_argument("--profilers", default="ours,today's")
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--freq-step", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--round-ticks", type=int, help="the sweep's round_ticks (default 20)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    cells = []
    print(
        f"{GPU_TYPE} emulated, 1F1B {args.stages} x {args.microbatches}, every "
        f"{args.freq_step}th clock; ours = estimator 'windows', today's = 'breakdown' "
        "(1 iteration a round)"
    )
    print(
        "| sensors | instructions | profiler | rounds | iterations | seconds | off-plan energy "
        "| energy error median / p95 | blocking power error | deployed plan vs truth's best |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for length in args.lengths.split(","):
        for sensors in args.sensors.split(","):
            for profiler in args.profilers.split(","):
                cell = run_cell(sensors, length, profiler, args)
                cells.append(cell)
                if cell.failed:
                    print(f"| {sensors} | {length} | {profiler} | no profile: {cell.failed[:90]} |")
                    continue
                print(
                    f"| {sensors} | {length} | {profiler} | {cell.rounds} | {cell.iterations} "
                    f"| {cell.seconds:.1f} s | {cell.off_plan_energy_j / 1000:+.1f} kJ "
                    f"| {cell.err_median:.2%} / {cell.err_p95:.2%} | {cell.block_err:+.1%} "
                    f"| {cell.plan_gap:+.2%}{' (held at all-max)' if cell.held else ''} |",
                    flush=True,
                )
    if args.json:
        args.json.write_text(json.dumps([asdict(c) for c in cells], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
