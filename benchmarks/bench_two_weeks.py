"""Benchmark: two weeks of one job, with what weeks bring, through the coordinator's own code.

A 4-stage 1F1B job, two data-parallel pipelines (8 emulated A100s, `VirtualCluster`), runs
for two simulated weeks through the coordinator's `JobManager` and `CoordinatedJob` (as the
HTTP routes call them, in one asyncio loop, the dump on) and the `Perseus` scheduler with
its defaults: it profiles online, deploys, guards. A round stands for `--round-s` seconds
of the job (10 s: a large model's few iterations); 1.2 M rounds of 1 s would measure the
scheduler's CPU, which `bench_soak.py` does. Injected, at fixed hours:

- **drift**: the GPUs' busy power rises by 7 % over day 2 (hours 24 to 48; the H200 of
  docs/measurements/h200-2026-11-26 drew 7 % more over a day) and stays there;
- **a failed solve**: from hour 36 the solve's memory limit is 1 MB until a solve fails
  (the drift's re-profile's), then lifted: the solve is tried again after its back-off;
- **a straggler**: pipeline 1 runs 10 % slower for 30 minutes at hour 60;
- **a coordinator restart**: at hour 96 the coordinator's state is dropped as by
  ``kill -9`` and a new `JobManager` reloads the job from its dump;
- **a host stall**: for 5 minutes at hour 150 every instruction waits 5 ms on its host.

Every round's results come from the cluster run under that round's conditions (clocks,
drift level in 0.5 % steps, straggler, stall), computed once per distinct condition and then
replayed with a seeded 1 % jitter (four copies in turn). The same conditions at all-max give
the counterfactual: each round does the work of `--round-s` seconds at all-max, and its energy
and time are that work's under the clocks it ran and under all-max.

Printed: the energy saved over the two weeks against all-max, the slowdown of every hour,
the hours over budget + 0.5 point and whether each lies in an event's recovery window (the
event to the guard's first keeping check after it, or the re-profile's end), how long each
recovery took, and the job's events.

    python benchmarks/bench_two_weeks.py [--days 14] [--round-s 10] [--budget 0.02]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_soak import jittered  # noqa: E402 (this folder is on sys.path)

from perseus.demo.virtual import VirtualCluster  # noqa: E402
from perseus.domain.schedule import make_schedule  # noqa: E402
from perseus.io.jobdir import JobDir  # noqa: E402
from perseus.protocol import (  # noqa: E402
    FrequencySchedule,
    JobInfo,
    PipelineSpec,
    ProfilingResult,
)
from perseus.schedulers.registry import resolve_scheduler  # noqa: E402
from perseus.server.job import CoordinatedJob  # noqa: E402
from perseus.server.job_manager import JobManager  # noqa: E402
from perseus.settings import PerseusSettings  # noqa: E402
from perseus.synth import stage_workloads  # noqa: E402

GPU = "A100-SXM"
STAGES, MICROBATCHES, DP = 4, 8, 2
WORK = [1.0, 1.6, 1.0, 1.2]
VARIANTS = 4
TOLERANCE = 0.005
"""The guard's documented floor above the budget (docs/guard.md)."""

HOUR = 3600.0
DRIFT = (24.0, 48.0, 0.07)
"""(start hour, end hour, busy-power rise reached at the end, held after)."""
SOLVE_FAIL_FROM = 36.0
STRAGGLER = (60.0, 60.5, 1.10)
RESTART_AT = 96.0
STALL = (150.0, 150.0 + 5 / 60, 0.005)


def drift_at(hour: float) -> float:
    start, end, rise = DRIFT
    if hour <= start:
        return 0.0
    return rise * min(1.0, (hour - start) / (end - start))


@dataclass
class Conditions:
    drift: float = 0.0
    straggler: bool = False
    stall: bool = False

    def key(self) -> tuple[float, bool, bool]:
        return (round(self.drift / 0.005) * 0.005, self.straggler, self.stall)


@dataclass
class World:
    """The emulated job under given conditions, run once per distinct round."""

    cluster: VirtualCluster
    rng: random.Random
    cache: dict[tuple[Any, ...], tuple[list[list[ProfilingResult]], int]] = field(
        default_factory=dict
    )
    truth: dict[tuple[Any, ...], tuple[float, float]] = field(default_factory=dict)
    """The round's own figures, before the jitter the ranks' copies carry."""
    all_max: dict[tuple[float, bool, bool], tuple[float, float]] = field(default_factory=dict)
    runs: int = 0

    def _apply(self, cond: Conditions) -> None:
        level, straggler, stall = cond.key()
        for gpu, clock in zip(self.cluster.gpus, self.cluster.clocks, strict=True):
            # The drift factor at the GPU's own clock is 1 + level (docs: EmulatedGPU).
            gpu.power_drift_per_hour = level
            gpu._opened_s = clock() - HOUR  # the benchmark's injection
        self.cluster.slowdown = {1: STRAGGLER[2]} if straggler else {}
        self.cluster.host_gap_s = STALL[2] if stall else 0.0

    def results(
        self, schedules: dict[int, FrequencySchedule], cond: Conditions
    ) -> tuple[list[ProfilingResult], tuple[float, float]]:
        """What the ranks report, and the round's (iteration time, energy) as run."""
        key = (cond.key(), *((r, tuple(s.frequencies)) for r, s in sorted(schedules.items())))
        if key not in self.cache:
            self._apply(cond)
            plain = [s.model_copy(update={"status": None}) for _, s in sorted(schedules.items())]
            base = self.cluster.run_round(plain)
            self.truth[key] = figures(base)
            self.runs += 1
            copies = [[jittered(r, self.rng, 0.01) for r in base] for _ in range(VARIANTS)]
            self.cache[key] = (copies, 0)
        copies, turn = self.cache[key]
        self.cache[key] = (copies, turn + 1)
        return copies[turn % VARIANTS], self.truth[key]

    def all_max_figures(self, infos: list[Any], cond: Conditions) -> tuple[float, float]:
        """(iteration time s, energy J per iteration, every GPU) at all-max under `cond`."""
        k = cond.key()
        if k not in self.all_max:
            self._apply(cond)
            schedules = []
            for info in infos:
                top = max(info.available_frequencies)
                order = self.cluster.pipeline.orders[info.pp_rank]
                schedules.append(
                    FrequencySchedule(rank=info.rank, frequencies=[(i.kind, top) for i in order])
                )
            self.all_max[k] = figures(self.cluster.run_round(schedules))
        return self.all_max[k]


def figures(results: list[ProfilingResult]) -> tuple[float, float]:
    """(the slowest rank's mean iteration time s, every GPU's energy per iteration J)."""
    t = max(sum(r.iter_time) / len(r.iter_time) for r in results)
    e = math.fsum(sum(r.iter_energy) / len(r.iter_energy) for r in results)
    return t, e


async def two_weeks(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    schedule = make_schedule("1f1b", STAGES, MICROBATCHES)
    pairs = stage_workloads(GPU, WORK, base_forward_ms=10.0)
    workloads = {}
    for stage, (fwd, bwd) in enumerate(pairs):
        workloads[stage, "forward"], workloads[stage, "backward"] = fwd, bwd
    cluster = VirtualCluster(
        schedule, workloads, gpu_type=GPU, dp_degree=DP, hop_latency_s=0.001, host_gap_s=0.0
    )
    world = World(cluster, random.Random(args.seed))
    settings = PerseusSettings(
        scheduler="Perseus",
        scheduler_args={"max_slowdown": args.budget},
        dump_dir=str(root / "dump"),
        dump_data=True,
    )
    cls = resolve_scheduler("Perseus")
    manager = JobManager(settings, cls, round_timeout_s=600.0)
    info = JobInfo(
        pp_degree=STAGES,
        dp_degree=DP,
        tp_degree=1,
        world_size=STAGES * DP,
        pipeline=PipelineSpec.of(schedule),
    )
    job_id = await manager.create_job(info)
    job = manager.get(job_id)
    infos = [i.model_copy(update={"emulated": False}) for i in cluster.rank_infos()]
    for i in infos:
        await job.register_rank(i)
    ranks = [i.rank for i in infos]

    rounds = int(args.days * 24 * HOUR / args.round_s)
    hours = math.ceil(rounds * args.round_s / HOUR)
    energy = [0.0] * hours
    energy_max = [0.0] * hours
    time_s = [0.0] * hours
    time_max = [0.0] * hours
    phases: list[Counter[str]] = [Counter() for _ in range(hours)]
    events: list[dict[str, Any]] = []
    solve_limited = False
    restarted = False
    started = time.perf_counter()
    for n in range(rounds):
        now_h = n * args.round_s / HOUR
        cond = Conditions(
            drift=drift_at(now_h),
            straggler=STRAGGLER[0] <= now_h < STRAGGLER[1],
            stall=STALL[0] <= now_h < STALL[1],
        )
        if not restarted and now_h >= RESTART_AT:
            restarted = True
            events.append({"round": job.round.number, "event": "coordinator killed and restarted"})
            # kill -9: the old manager is dropped as it is; a new one reloads the dump.
            manager = JobManager(settings, cls, round_timeout_s=600.0)
            await manager.reload()
            job = manager.get(job_id)
        scheduler: Any = job.scheduler
        if now_h >= SOLVE_FAIL_FROM and not solve_limited and scheduler is not None:
            solve_limited = True
            scheduler.settings = settings.model_copy(update={"solve_memory_mb": 1})
        got = await asyncio.gather(*(job.get_schedule(r) for r in ranks))
        schedules = {s.rank: s for s in got}
        results, (t, e) = world.results(schedules, cond)
        for result in results:
            await job.report_result(result)
        t0, e0 = world.all_max_figures(infos, cond)
        work = args.round_s / t0  # iterations of this round's seconds at all-max
        h = min(hours - 1, int(now_h))
        energy[h] += work * e
        energy_max[h] += work * e0
        time_s[h] += work * t
        time_max[h] += work * t0
        phases[h][job.scheduler.phase.value if job.scheduler is not None else "none"] += 1
        limited = scheduler is not None and scheduler.settings.solve_memory_mb == 1
        if limited and any(e.get("event") == "solve_failed" for e in job.stats.promise):
            scheduler.settings = settings  # the memory is back
        if n % max(1, rounds // 20) == 0 and n:
            print(
                f"  hour {now_h:6.1f}: {n / (time.perf_counter() - started):,.0f} rounds/s, "
                f"{world.runs} cluster runs, phase {job.scheduler.phase.value}",
                flush=True,
            )
    job.finish()
    await manager.close()
    record = JobDir.of(settings.dump_dir, job_id).promise.read_text().splitlines()
    events += [_brief(json.loads(line)) for line in record]
    for ev in events:
        ev["hour"] = ev["round"] * args.round_s / HOUR
    events.sort(key=lambda ev: ev["hour"])
    events.insert(0, {"round": 0, "hour": 0.0, "event": "start"})
    return _report(args, energy, energy_max, time_s, time_max, phases, events, world, started)


def _brief(event: dict[str, Any]) -> dict[str, Any]:
    out = {k: event[k] for k in ("round", "event", "reason") if k in event}
    if "reason" in out:
        out["reason"] = str(out["reason"])[:160]
    return out


def _report(
    args: argparse.Namespace,
    energy: list[float],
    energy_max: list[float],
    time_s: list[float],
    time_max: list[float],
    phases: list[Counter[str]],
    events: list[dict[str, Any]],
    world: World,
    started: float,
) -> dict[str, Any]:
    slowdown = [t / t0 - 1.0 if t0 else 0.0 for t, t0 in zip(time_s, time_max, strict=True)]
    saving = 1.0 - math.fsum(energy) / math.fsum(energy_max)
    total_slowdown = math.fsum(time_s) / math.fsum(time_max) - 1.0
    limit = args.budget + TOLERANCE
    recoveries = _recoveries(events)
    windows = [(r["from_h"], r["to_h"]) for r in recoveries if r["to_h"] is not None]
    over = []
    for h, s in enumerate(slowdown):
        if s > limit:
            inside = any(a - 1 <= h <= b for a, b in windows)
            over.append({"hour": h, "slowdown": s, "in_recovery": inside, "phases": phases[h]})
    return {
        "days": args.days,
        "round_s": args.round_s,
        "budget": args.budget,
        "saving": saving,
        "slowdown": total_slowdown,
        "hours": len(slowdown),
        "hours_over_limit": len(over),
        "hours_over_limit_outside_recovery": sum(not o["in_recovery"] for o in over),
        "worst_hour_slowdown": max(slowdown),
        "over": over,
        "recoveries": recoveries,
        "events": events,
        "cluster_runs": world.runs,
        "wall_s": time.perf_counter() - started,
        "hourly_slowdown": slowdown,
    }


def _recoveries(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per injected event or guard decision that withdrew the plan, the hours from it to
    the next deployment the guard then kept (a ``check`` that keeps the plan)."""
    out = []
    starts = [
        ("profiling at the job's start", "start"),
        ("drift re-profile", "reprofile"),
        ("solve failure", "solve_failed"),
        ("fall-back", "fallback"),
        ("move", "move"),
        ("restart", "coordinator killed and restarted"),
    ]
    for name, marker in starts:
        for i, ev in enumerate(events):
            if ev["event"] != marker:
                continue
            end = None
            for later in events[i + 1 :]:
                if later["event"] == "check" and "keeps the plan" in later.get("reason", ""):
                    end = later["hour"]
                    break
            out.append(
                {
                    "what": name,
                    "from_h": ev["hour"],
                    "to_h": end,
                    "minutes": None if end is None else 60 * (end - ev["hour"]),
                }
            )
    return sorted(out, key=lambda r: r["from_h"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--days", type=float, default=14.0)
    p.add_argument("--round-s", type=float, default=10.0)
    p.add_argument("--budget", type=float, default=0.02)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        out = asyncio.run(two_weeks(args, Path(tmp)))
    print(f"\n{args.days:g} days, rounds of {args.round_s:g} s, budget {args.budget:.0%}:")
    print(
        f"  energy saved vs all-max: {out['saving']:.2%}; slowdown over the period "
        f"{out['slowdown']:+.2%}; worst hour {out['worst_hour_slowdown']:+.2%}"
    )
    print(
        f"  hours over budget + {TOLERANCE:.1%}: {out['hours_over_limit']} of {out['hours']}, "
        f"outside a recovery window: {out['hours_over_limit_outside_recovery']}"
    )
    for o in out["over"]:
        print(
            f"    hour {o['hour']}: {o['slowdown']:+.2%} "
            f"({'recovery' if o['in_recovery'] else 'OUTSIDE recovery'}; {dict(o['phases'])})"
        )
    print("  recoveries:")
    for r in out["recoveries"]:
        took = "not recovered" if r["minutes"] is None else f"{r['minutes']:.0f} min"
        print(f"    {r['what']} at hour {r['from_h']:.2f}: {took}")
    print("  events:")
    for ev in out["events"]:
        if ev["event"] != "check" or "keeps" not in ev.get("reason", "") or "still" not in ev.get(
            "reason", ""
        ):
            print(f"    h{ev['hour']:7.2f} {ev['event']}: {ev.get('reason', '')[:120]}")
    print(f"  ({out['cluster_runs']} cluster runs, {out['wall_s']:.0f} s)")
    if args.json is not None:
        out["over"] = [{**o, "phases": dict(o["phases"])} for o in out["over"]]
        args.json.write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    _ = CoordinatedJob  # the job class the manager drives (imported for the reader)
    main()
