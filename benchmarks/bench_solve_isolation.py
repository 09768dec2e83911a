"""Benchmark: the coordinator's round latency while big frontier solves run.

    python benchmarks/bench_solve_isolation.py [--jobs 8] [--solves 4] [--shape 16x128]
        [--workers 4] [--phase-s 30] [--threads] [--json out.json]

A coordinator (`perseus.server.create_app` under uvicorn, in a process of its own, the
`Perseus` scheduler) serves `--jobs` running jobs: 2 ranks each (1F1B 2 × 4 on emulated
A100s; their all-max results are computed once and sent every round), every job asking for
its next schedule (``GET /schedule``, both ranks at once: the round's barrier) every
`--round-s` seconds, as training iterations would, and posting its results. The latency
of a round is from its first request sent to its last schedule received, measured by the
client, a process of its own too.

Phases of `--phase-s` seconds alternate: *idle* (no solve) and *solving*, during which
`--solves` frontier solves of `--shape` (stages x microbatches, 1F1B, a synthetic A100
profile, 15 ms clock switches) run in the coordinator the way a job's solve runs: submitted
to its solve pool (`perseus.schedulers.perseus_scheduler.solve_pool`, ``PERSEUS_SOLVE_WORKERS`` = `--workers`), each
in a process of its own. With `--threads` they run on threads of the coordinator's own
process instead (how solves ran before the pool), for comparison (one phase pair only: a
thread cannot be stopped). The solves are started before a solving phase and stopped after
it (they take minutes; the phase must not outlast them: the script checks that none ended
inside it).

Prints, per phase kind, the rounds measured and the p50 / p99 latency, and the ratio of
p99 solving / p99 idle (target: within 2x).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
if str(REPO / "tests") not in sys.path:
    sys.path.insert(0, str(REPO / "tests"))


# ---------------------------------------------------------------------- the coordinator
def _solve_request(shape: tuple[int, int], out_dir: Path, k: int) -> Any:
    from perseus.domain.profile import InstructionProfile
    from perseus.domain.schedule import make_schedule
    from perseus.schedulers.perseus_scheduler.plan_model import SolveRequest
    from perseus.synth import stage_workloads, synthesize_profile

    stages, microbatches = shape
    work = [1.0 + 0.1 * (s % 4) for s in range(stages)]
    frame = synthesize_profile("A100-SXM", stage_workloads("A100-SXM", work, base_forward_ms=10.0))
    return SolveRequest(
        job_id=f"bench-{k}",
        profile=InstructionProfile.from_frame(frame),
        pipeline=make_schedule("1f1b", stages, microbatches),
        p2p_power_w=75.0,
        switch_latency_s=0.015,
        hop_latency_s=0.0005,
        out_dir=out_dir / f"frontier-{k}",
    )


def serve(port: int, workers: int, shape: tuple[int, int], threads: bool, dump: Path) -> None:
    """The coordinator's process: the app, plus two routes of this benchmark's own that
    start and stop the solves inside it."""
    import uvicorn

    from perseus.schedulers.perseus_scheduler.plan_model import solve_in_process
    from perseus.schedulers.perseus_scheduler.solve_pool import PoolSolve, solve_pool
    from perseus.server import create_app
    from perseus.settings import PerseusSettings

    settings = PerseusSettings(
        scheduler="Perseus",
        # The running jobs stay in their all-max rounds (no sweep, no solve of their own).
        scheduler_args={"num_microbatches": 4, "baseline_rounds": 1000},
        dump_dir=str(dump),
        solve_workers=workers,
    )
    app = create_app(settings, round_timeout_s=600.0)
    pool_solves: list[PoolSolve[Any]] = []
    thread_solves: list[threading.Thread] = []

    def start(n: int) -> dict[str, int]:
        for k in range(n):
            request = _solve_request(shape, dump, len(pool_solves) + len(thread_solves) + k)
            if threads:
                t = threading.Thread(target=solve_in_process, args=(request,), daemon=True)
                t.start()
                thread_solves.append(t)
            else:
                pool_solves.append(
                    solve_pool(workers).submit(
                        solve_in_process, request, name=f"bench-{k}", timeout_s=3600.0
                    )
                )
        return status()

    def status() -> dict[str, int]:
        return {
            "running": sum(s.pid is not None for s in pool_solves)
            + sum(t.is_alive() for t in thread_solves),
            "ended": sum(s.done() for s in pool_solves),
        }

    def stop() -> dict[str, int]:
        for s in pool_solves:
            s.cancel()
        pool_solves.clear()
        return status()

    app.add_api_route("/bench/solves", start, methods=["POST"])
    app.add_api_route("/bench/solves", status, methods=["GET"])
    app.add_api_route("/bench/solves", stop, methods=["DELETE"])
    # Keep-alive past a phase: a connection the server closes as the client reuses it
    # would be a client error, not latency.
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        timeout_keep_alive=3600,
        timeout_graceful_shutdown=2,
    )


# ---------------------------------------------------------------------- the jobs
class Job:
    """One running job's 2 ranks: registered once, then a round every `round_s`."""

    def __init__(self, url: str) -> None:
        from server_fixtures import GroundTruth, SimulatedJob

        self.sim = SimulatedJob(url, GroundTruth([0.010, 0.016]), pp=2, num_microbatches=4)
        self.results: list[Any] | None = None

    async def register(self, client: httpx.AsyncClient) -> None:
        await self.sim.register(client)

    async def round(self, client: httpx.AsyncClient) -> float:
        sim = self.sim
        t0 = time.perf_counter()
        responses = await asyncio.gather(
            *(
                client.get(
                    f"{sim.base_url}/schedule/{sim.job_id}",
                    params={"rank": i.rank},
                    headers=sim.headers,
                )
                for i in sim.infos
            )
        )
        latency = time.perf_counter() - t0
        for r in responses:
            r.raise_for_status()
        if self.results is None:  # every round is all-max: its results, once
            from perseus.protocol import FrequencySchedule

            schedules = {
                s.rank: s for s in (FrequencySchedule.model_validate(r.json()) for r in responses)
            }
            self.results = sim.results_for(schedules)
        for res in self.results:
            r = await client.post(
                f"{sim.base_url}/result/{sim.job_id}", json=res.model_dump(), headers=sim.headers
            )
            r.raise_for_status()
        return latency


async def _phase(jobs: list[Job], client: httpx.AsyncClient, seconds: float, round_s: float):
    latencies: list[float] = []
    end = time.monotonic() + seconds

    async def loop(job: Job) -> None:
        while time.monotonic() < end:
            latencies.append(await job.round(client))
            await asyncio.sleep(round_s)

    await asyncio.gather(*(loop(j) for j in jobs))
    return latencies


def _p(values: list[float], q: int) -> float:
    return (
        statistics.quantiles(values, n=100, method="inclusive")[q - 1] if q < 100 else max(values)
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def drive(url: str, args: argparse.Namespace) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=4 * args.jobs, max_keepalive_connections=4 * args.jobs)
    async with httpx.AsyncClient(timeout=600.0, limits=limits) as client:
        deadline = time.monotonic() + 60
        while True:
            try:
                if (await client.get(f"{url}/healthz")).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the coordinator did not start")
            await asyncio.sleep(0.2)
        jobs = [Job(url) for _ in range(args.jobs)]
        for job in jobs:
            await job.register(client)
        await _phase(jobs, client, 5.0, args.round_s)  # warm-up
        phases: dict[str, list[float]] = {"idle": [], "solving": []}
        for _ in range(args.repeat):
            phases["idle"] += await _phase(jobs, client, args.phase_s, args.round_s)
            started = (await client.post(f"{url}/bench/solves", params={"n": args.solves})).json()
            t0 = time.monotonic()
            while (await client.get(f"{url}/bench/solves")).json()["running"] < min(
                args.solves, args.workers if not args.threads else args.solves
            ):
                if time.monotonic() - t0 > 60:
                    raise RuntimeError(f"the solves did not start: {started}")
                await asyncio.sleep(0.1)
            phases["solving"] += await _phase(jobs, client, args.phase_s, args.round_s)
            state = (await client.get(f"{url}/bench/solves")).json()
            if state["ended"]:
                raise RuntimeError(
                    f"{state['ended']} solve(s) ended inside the phase: lengthen them"
                )
            await client.delete(f"{url}/bench/solves")
    out: dict[str, Any] = {}
    for name, values in phases.items():
        out[name] = {
            "rounds": len(values),
            "p50_ms": 1000 * statistics.median(values),
            "p99_ms": 1000 * _p(values, 99),
        }
    out["p99_ratio"] = out["solving"]["p99_ms"] / out["idle"]["p99_ms"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--solves", type=int, default=4)
    parser.add_argument("--shape", default="16x128", help="stages x microbatches of a solve")
    parser.add_argument("--workers", type=int, default=4, help="PERSEUS_SOLVE_WORKERS")
    parser.add_argument("--phase-s", type=float, default=30.0)
    parser.add_argument("--repeat", type=int, default=2, help="idle/solving phase pairs")
    parser.add_argument("--round-s", type=float, default=0.2, help="a job's time between rounds")
    parser.add_argument("--threads", action="store_true", help="solve on threads (before)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--dump", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    stages, microbatches = (int(x) for x in args.shape.lower().split("x"))
    if args.threads and not args.serve and args.repeat > 1:
        print("--threads: solves on threads cannot be stopped, so one phase pair only")
        args.repeat = 1
    if args.serve:
        serve(args.serve, args.workers, (stages, microbatches), args.threads, args.dump)
        return
    port = _free_port()
    with tempfile.TemporaryDirectory() as dump:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
        env["ZEUS_GPU_BACKEND"] = "emulated"
        command = [sys.executable, __file__, "--serve", str(port), "--dump", dump]
        command += ["--workers", str(args.workers), "--shape", args.shape]
        command += ["--threads"] if args.threads else []
        server = subprocess.Popen(command, env=env)
        try:
            result = asyncio.run(drive(f"http://127.0.0.1:{port}", args))
        finally:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    how = "threads of the coordinator" if args.threads else f"its solve pool ({args.workers})"
    print(
        f"{args.jobs} jobs, a round every {args.round_s:g} s; {args.solves} solves of "
        f"{args.shape} on {how}; {os.cpu_count()} CPUs"
    )
    for name in ("idle", "solving"):
        r = result[name]
        print(
            f"  {name:8s} {r['rounds']:5d} rounds  p50 {r['p50_ms']:7.1f} ms  "
            f"p99 {r['p99_ms']:7.1f} ms"
        )
    print(f"  p99 solving / idle: {result['p99_ratio']:.2f}x (target: within 2x)")
    if args.json:
        record = {"args": vars(args) | {"json": None, "cpus": os.cpu_count()}, **result}
        args.json.write_text(json.dumps(record, indent=2, default=str))


if __name__ == "__main__":
    main()
