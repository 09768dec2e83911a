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
polls it every 2.4 ms (one read's latency) as `perseus.client.gpu.sensing.CounterPoller` does;
its energy windows come from `perseus.client.gpu.sensing.energy_windows`. So the scheduler sees
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
import json
import math
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from sensor_ranks import GPU_TYPE, Ranks, dvfs_truth  # this script's folder is on sys.path

from perseus.domain.schedule import make_schedule
from perseus.errors import ProfileError
from perseus.planning import evaluate, solve_frontier
from perseus.schedulers.base import build_scheduler
from perseus.schedulers.perseus_scheduler.scheduler import Perseus, PerseusPhase
from perseus.settings import PerseusSettings
from zeus_power.device import SensorSpec
from zeus_power.device.sensors import IDEAL_SENSORS

SENSORS = {
    "ideal": IDEAL_SENSORS,
    "100ms": SensorSpec(period_s=0.1, window=1.0, read_latency_s=0.0, noise=0.01),
    "100ms-25%": SensorSpec(period_s=0.1, window=0.25, read_latency_s=0.0, noise=0.01),
}
"""Read latency 0 here: in virtual time a read costs nothing; the poller reads every 2.4 ms."""
LENGTHS_MS = {"sub-ms": 0.6, "ms": 3.0, "10ms": 12.0}


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
        dvfs_truth(LENGTHS_MS[length]),
        SENSORS[sensors_name],
        seed=args.seed,
        exact_breakdown=profiler == "today's" and sensors_name == "ideal",
    )
    info = ranks.job_info(f"bench-{sensors_name}-{length}-{profiler}")
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
