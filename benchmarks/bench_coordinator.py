"""Benchmark: one scheduling round of the Perseus coordinator for many simulated ranks.

Starts the real coordinator (``python -m perseus serve``) in a subprocess on a loopback
port, registers one job of `--ranks` ranks (pp × dp), then times one round: every rank
asks ``GET /schedule`` at once (asyncio; one `httpx.AsyncClient` per rank, as every rank
of a real job owns its client — one shared client would measure httpcore's connection
pool, whose bookkeeping grows quadratically with 1000 concurrent requests) and the round
ends when all have their schedule. A second round, with every rank's
`ProfilingResult` posted first, times the observe path too. Target: ≤ 5 s for 1024 ranks.

    python benchmarks/bench_coordinator.py [--ranks 1024] [--pp 8] [--microbatches 8]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import ssl
import subprocess
import sys
import time

import httpx

TARGET_S = 5.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_up(
    client: httpx.AsyncClient, proc: subprocess.Popen | None, timeout_s: float = 30
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"coordinator exited with {proc.returncode}")
        try:
            if (await client.get("/info")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.1)
    raise SystemExit("coordinator did not start")


async def run(args: argparse.Namespace, base_url: str, proc: subprocess.Popen | None) -> dict:
    pp = args.pp
    dp = args.ranks // pp
    world = pp * dp
    tls = ssl.create_default_context()  # one context for all clients (loopback: unused)
    clients = [httpx.AsyncClient(base_url=base_url, timeout=120, verify=tls) for _ in range(world)]
    async with contextlib.AsyncExitStack() as stack:
        for c in clients:
            await stack.enter_async_context(c)
        client = clients[0]
        await wait_up(client, proc)
        job = {"pp_degree": pp, "dp_degree": dp, "tp_degree": 1, "world_size": world}
        job_id = (await client.post("/register_job", json=job)).json()
        freqs = list(range(1410, 200, -15))
        t0 = time.perf_counter()
        sem = asyncio.Semaphore(256)

        async def register(rank: int) -> None:
            info = {
                "rank": rank,
                "dp_rank": rank // pp,
                "pp_rank": rank % pp,
                "tp_rank": 0,
                "available_frequencies": freqs,
            }
            async with sem:
                r = await clients[rank].post(f"/register_rank/{job_id}", json=info)
            r.raise_for_status()

        await asyncio.gather(*(register(r) for r in range(world)))
        register_s = time.perf_counter() - t0
        print(f"registered {world} ranks in {register_s:.2f} s", file=sys.stderr)

        async def ask(rank: int) -> list:
            r = await clients[rank].get(f"/schedule/{job_id}", params={"rank": rank})
            r.raise_for_status()
            body = r.json()
            assert body["rank"] == rank
            return body["frequencies"]

        t0 = time.perf_counter()
        schedules = await asyncio.gather(*(ask(r) for r in range(world)))
        round1_s = time.perf_counter() - t0
        print(f"round 1: {round1_s:.2f} s", file=sys.stderr)

        async def report(rank: int, frequencies: list) -> None:
            n = {k: sum(1 for name, _ in frequencies if name == k) for k in ("forward", "backward")}
            result = {
                "rank": rank,
                "iter_time": [1.0],
                "iter_energy": [300.0],
                "time_breakdown": {k: [[0.05] * c] for k, c in n.items()},
                "energy_breakdown": {k: [[15.0] * c] for k, c in n.items()},
            }
            async with sem:
                r = await clients[rank].post(f"/result/{job_id}", json=result)
            r.raise_for_status()

        t0 = time.perf_counter()
        await asyncio.gather(*(report(r, s) for r, s in enumerate(schedules)))
        report_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        await asyncio.gather(*(ask(r) for r in range(world)))
        round2_s = time.perf_counter() - t0
    return {
        "ranks": world,
        "pp": pp,
        "dp": dp,
        "microbatches": args.microbatches,
        "scheduler": args.scheduler,
        "register_all_s": round(register_s, 3),
        "round_s": round(round1_s, 3),
        "report_all_s": round(report_s, 3),
        "round_with_observe_s": round(round2_s, 3),
        "target_s": TARGET_S,
        "meets_target": round1_s <= TARGET_S and round2_s <= TARGET_S,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--pp", type=int, default=8)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--scheduler", default="AllMaxFrequency")
    parser.add_argument(
        "--url", help="Use a coordinator already running there (its own PERSEUS_* settings)."
    )
    args = parser.parse_args()
    if args.ranks % args.pp:
        raise SystemExit(f"--ranks {args.ranks} must be a multiple of --pp {args.pp}")
    if args.url:
        out = asyncio.run(run(args, args.url, None))
        report(out)
        return
    port = free_port()
    env = {
        **os.environ,
        "PERSEUS_SCHEDULER": args.scheduler,
        "PERSEUS_SCHEDULER_ARGS": json.dumps({"num_microbatches": args.microbatches}),
        "PERSEUS_DUMP_DATA": "false",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "perseus", "serve", "--port", str(port), "--log-level", "warning"],
        env=env,
        stdout=subprocess.DEVNULL,
    )
    try:
        out = asyncio.run(run(args, f"http://127.0.0.1:{port}", proc))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    report(out)


def report(out: dict) -> None:
    print(json.dumps(out))
    status = "OK" if out["meets_target"] else "MISSED"
    print(
        f"{out['ranks']} ranks ({out['pp']} stages × {out['dp']} pipelines): one round "
        f"{out['round_s']:.2f} s, with observe {out['round_with_observe_s']:.2f} s "
        f"(target ≤ {TARGET_S:.0f} s) — {status}"
    )


if __name__ == "__main__":
    main()
