"""Benchmark: one job for a million rounds through the coordinator's own job and scheduler code.

Weeks of a job in minutes: a 4-stage 1F1B job on emulated A100s (`VirtualCluster`, with the
profile given, so the job deploys a plan at once and the soak is the long run: guard
checks, all-max reference rounds, the energy report, the promise's history, the dump) is
driven through the coordinator's `JobManager` and `CoordinatedJob` in one asyncio loop,
as the HTTP routes call them (register, every rank's ``get_schedule`` long-poll, every
rank's ``report_result``), with the job's dump on (``PERSEUS_DUMP_DATA``: results,
schedules and plans on disk, pruned to ``dump_keep_rounds``). Only HTTP itself is left
out: it is per request, not per job's age (`bench_coordinator.py` times it).

Each round's results come from the cluster run on that round's schedules once per distinct
schedule and then replayed with a seeded 1 % jitter on every time and energy (running the
emulator a million times would measure the emulator). At 1 s per round a million rounds is
11.6 days of a job.

Printed, for the first and the last 10 % of the rounds: the coordinator process's CPU
seconds per round (``time.process_time``, which the simulated ranks share but do not grow
with the job's age) and its resident memory (``/proc/self/statm``); and the job's dump on
disk. Targets (issue 49): RSS growth ≤ 20 MB from the end of the first 10 % to the end,
per-round CPU of the last 10 % within 20 % of the first 10 %.

    python benchmarks/bench_soak.py [--rounds 1000000] [--stages 4] [--microbatches 8]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from perseus.demo.virtual import VirtualCluster  # noqa: E402
from perseus.domain.profile import InstructionProfile  # noqa: E402
from perseus.domain.schedule import make_schedule  # noqa: E402
from perseus.io.profile_csv import save_profile  # noqa: E402
from perseus.protocol import FrequencySchedule, JobInfo, ProfilingResult  # noqa: E402
from perseus.schedulers.registry import resolve_scheduler  # noqa: E402
from perseus.server.job_manager import JobManager  # noqa: E402
from perseus.settings import PerseusSettings  # noqa: E402
from perseus.synth import stage_workloads, synthesize_profile  # noqa: E402

GPU = "A100-SXM"
VARIANTS = 16
"""Jittered copies of each distinct schedule's results, replayed in turn."""
RSS_GROWTH_MB = 20.0
CPU_RATIO = 1.2


def rss_mb() -> float:
    """This process's resident memory now, MB."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 1e6


def jittered(result: ProfilingResult, rng: random.Random, sigma: float) -> ProfilingResult:
    """`result` with every time and energy scaled by its own 1 + N(0, sigma) (each window's
    energy too), so that the guard sees rounds that differ as measured ones do."""

    def f() -> float:
        return max(0.5, 1.0 + sigma * rng.gauss(0.0, 1.0))

    data = result.model_dump()
    data["iter_time"] = [t * f() for t in data["iter_time"]]
    data["iter_energy"] = [e * f() for e in data["iter_energy"]]
    for key in ("time_breakdown", "energy_breakdown"):
        data[key] = {k: [[x * f() for x in it] for it in v] for k, v in data[key].items()}
    return ProfilingResult.model_validate(data)


class Replay:
    """Each talking rank's result for a round of given schedules: the cluster run once per
    distinct set of schedules, then `VARIANTS` jittered copies in turn."""

    def __init__(self, cluster: VirtualCluster, seed: int) -> None:
        self.cluster = cluster
        self.rng = random.Random(seed)
        self.cache: dict[tuple[Any, ...], tuple[list[list[ProfilingResult]], int]] = {}

    def results(self, schedules: dict[int, FrequencySchedule]) -> list[ProfilingResult]:
        key = tuple((r, tuple(s.frequencies), s.steps) for r, s in sorted(schedules.items()))
        if key not in self.cache:
            plain = [s.model_copy(update={"status": None}) for _, s in sorted(schedules.items())]
            base = self.cluster.run_round(plain)
            copies = [[jittered(r, self.rng, 0.01) for r in base] for _ in range(VARIANTS)]
            self.cache[key] = (copies, 0)
        copies, turn = self.cache[key]
        self.cache[key] = (copies, turn + 1)
        return copies[turn % VARIANTS]


async def soak(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    schedule = make_schedule("1f1b", args.stages, args.microbatches)
    # Uneven stages: the last is the slowest, so the others have slack to save.
    scales = [0.7 + 0.3 * s / max(1, args.stages - 1) for s in range(args.stages)]
    pairs = stage_workloads(GPU, scales, base_forward_ms=8.0, memory_fraction=0.3)
    workloads = {}
    for stage, (fwd, bwd) in enumerate(pairs):
        workloads[stage, "forward"], workloads[stage, "backward"] = fwd, bwd
    profile = root / "truth.csv"
    save_profile(InstructionProfile.from_frame(synthesize_profile(GPU, pairs)), profile)
    cluster = VirtualCluster(schedule, workloads, gpu_type=GPU)
    scheduler_args = {
        "num_microbatches": args.microbatches,
        "max_slowdown": 0.02,
        "profile_path": str(profile),
    }
    settings = PerseusSettings(
        scheduler="Perseus",
        scheduler_args=scheduler_args,
        dump_dir=str(root / "dump"),
        dump_data=True,
    )
    manager = JobManager(settings, resolve_scheduler("Perseus"), round_timeout_s=600.0)
    info = JobInfo(
        pp_degree=args.stages, dp_degree=1, tp_degree=1, world_size=args.stages
    )
    job_id = await manager.create_job(info)
    job = manager.get(job_id)
    infos = [i.model_copy(update={"emulated": False}) for i in cluster.rank_infos()]
    for i in infos:
        await job.register_rank(i)
    replay = Replay(cluster, args.seed)
    ranks = [i.rank for i in infos]
    tenth = max(1, args.rounds // 10)
    marks: list[tuple[int, float, float, float]] = []  # (round, cpu, wall, rss)
    started = time.perf_counter()
    for n in range(args.rounds):
        if n % tenth == 0 or n == args.rounds - 1:
            marks.append((n, time.process_time(), time.perf_counter(), rss_mb()))
            if n:
                rate = n / (time.perf_counter() - started)
                print(
                    f"  round {n:>9,}: {rate:,.0f} rounds/s, RSS {marks[-1][3]:.1f} MB, "
                    f"state {job.phase.value}",
                    flush=True,
                )
        got = await asyncio.gather(*(job.get_schedule(r) for r in ranks))
        schedules = {s.rank: s for s in got}
        for result in replay.results(schedules):
            await job.report_result(result)
    marks.append((args.rounds, time.process_time(), time.perf_counter(), rss_mb()))
    detail = {
        "state": job.phase.value,
        "promise_events": len(job.stats.promise),
        "distinct_rounds": len(replay.cache),
    }
    job.finish()
    await manager.close()
    dump_bytes = sum(p.stat().st_size for p in (root / "dump").rglob("*") if p.is_file())
    first = marks[1]
    last_start = marks[-2]
    last = marks[-1]
    cpu_first = (first[1] - marks[0][1]) / max(1, first[0] - marks[0][0])
    cpu_last = (last[1] - last_start[1]) / max(1, last[0] - last_start[0])
    return {
        "rounds": args.rounds,
        "stages": args.stages,
        "microbatches": args.microbatches,
        "wall_s": last[2] - marks[0][2],
        "cpu_ms_per_round_first_10pct": 1000 * cpu_first,
        "cpu_ms_per_round_last_10pct": 1000 * cpu_last,
        "cpu_ratio": cpu_last / cpu_first if cpu_first > 0 else float("inf"),
        "rss_mb_after_first_10pct": first[3],
        "rss_mb_end": last[3],
        "rss_growth_mb": last[3] - first[3],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "dump_mb": dump_bytes / 1e6,
        **detail,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=1_000_000)
    p.add_argument("--stages", type=int, default=4)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    if args.rounds < 20:
        p.error("--rounds must be at least 20")
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        out = asyncio.run(soak(args, Path(tmp)))
    print(json.dumps(out, indent=2))
    ok_rss = out["rss_growth_mb"] <= RSS_GROWTH_MB
    ok_cpu = out["cpu_ratio"] <= CPU_RATIO
    print(
        f"RSS growth {out['rss_growth_mb']:+.1f} MB (target ≤ {RSS_GROWTH_MB:.0f}): "
        f"{'met' if ok_rss else 'MISSED'}; CPU per round last/first 10 % "
        f"{out['cpu_ratio']:.2f} (target ≤ {CPU_RATIO}): {'met' if ok_cpu else 'MISSED'}; "
        f"ended {out['state']}"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
