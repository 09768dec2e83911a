"""Simulated ranks for `bench_coordinator.py`: their payloads and their HTTP clients.

Ranks are simulated with asyncio, one `httpx.AsyncClient` and one connection per rank (as
every rank of a real job owns its client), spread over client processes that go through
each phase (register, first schedule, the timed round) in step, with a barrier per phase.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import multiprocessing
import os
import ssl
import sys
import time
from pathlib import Path
from typing import Any

import httpx

JOB_TOKEN_HEADER = "X-Perseus-Job-Token"
RANKS_PER_CLIENT_PROC = 6000
"""Simulated ranks per client process (each holds one connection per rank)."""
FREQS = list(range(1410, 200, -15))  # an A100's 81 SM clocks


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------- payloads
def result_body(rank: int, frequencies: list, replicas: list[int] | None) -> dict[str, Any]:
    """A rank's (or a leader's folded) result for one iteration of its schedule."""
    counts = {k: sum(1 for name, _ in frequencies if name == k) for k in ("forward", "backward")}
    body: dict[str, Any] = {
        "rank": rank,
        "iter_time": [1.0],
        "iter_energy": [300.0],
        "time_breakdown": {k: [[0.02 + 0.0001 * i for i in range(c)]] for k, c in counts.items()},
        "energy_breakdown": {k: [[6.0 + 0.01 * i for i in range(c)]] for k, c in counts.items()},
    }
    if replicas is not None:
        body["replicas"] = [
            {"dp_rank": d, "iter_time_s": 1.0, "busy_s": 0.9, "energy_j": 2400.0} for d in replicas
        ]
        body["idle_power_w"] = 95.0
    return body


def talkers(args: argparse.Namespace, ranks: int, leaders: bool) -> tuple[dict, list[dict]]:
    """The job's registration and the RankInfo of every rank that talks."""
    pp, tp = args.pp, args.tp
    dp = ranks // (pp * tp)
    job: dict[str, Any] = {"pp_degree": pp, "dp_degree": dp, "tp_degree": tp, "world_size": ranks}
    from perseus.protocol import PROTOCOL_VERSION, Leaders, ParallelLayout

    layout = ParallelLayout(dp, pp, tp)
    if not leaders:
        infos = []
        for r in range(ranks):
            d, p, t = layout.coordinates(r)
            infos.append(
                {
                    "rank": r,
                    "dp_rank": d,
                    "pp_rank": p,
                    "tp_rank": t,
                    "available_frequencies": FREQS,
                }
            )
        return job, infos
    job |= {"protocol_version": PROTOCOL_VERSION, "leaders_per_stage": args.leaders_per_stage}
    rule = Leaders(layout, args.leaders_per_stage)
    infos = [
        {
            "rank": layout.rank_of(d, p),
            "dp_rank": d,
            "pp_rank": p,
            "tp_rank": 0,
            "available_frequencies": FREQS,
            "replicas": list(rule.block(d)),
        }
        for d in rule.replicas
        for p in range(pp)
    ]
    return job, infos


# ---------------------------------------------------------------------------- HTTP clients
PHASES = ("register", "first", "round")


async def _drive(
    url: str, headers: dict, job_id: str, infos: list[dict], local: str, barrier, out
) -> None:
    """One client process: its talkers through every phase, in step with the others."""
    tls = ssl.create_default_context()  # one for all clients (loopback: unused): each of its
    # own would load the CA bundle again, 0.6 MB and milliseconds per simulated rank
    clients = {
        i["rank"]: httpx.AsyncClient(
            base_url=url,
            timeout=600,
            headers=headers,
            transport=httpx.AsyncHTTPTransport(
                verify=tls, local_address=local, limits=httpx.Limits(max_connections=1)
            ),
        )
        for i in infos
    }
    sem = asyncio.Semaphore(256)
    schedules: dict[int, list] = {}
    async with contextlib.AsyncExitStack() as stack:
        for c in clients.values():
            await stack.enter_async_context(c)

        async def register(info: dict) -> None:
            async with sem:
                r = await clients[info["rank"]].post(f"/register_rank/{job_id}", json=info)
            r.raise_for_status()

        async def ask(rank: int) -> None:
            r = await clients[rank].get(f"/schedule/{job_id}", params={"rank": rank})
            r.raise_for_status()
            body = r.json()
            if body["rank"] != rank:
                raise RuntimeError(f"rank {rank} got rank {body['rank']}'s schedule")
            schedules[rank] = body["frequencies"]

        async def round_(info: dict) -> None:
            rank = info["rank"]
            body = result_body(rank, schedules[rank], info.get("replicas"))
            async with sem:
                r = await clients[rank].post(f"/result/{job_id}", json=body)
            r.raise_for_status()
            await ask(rank)

        barrier.wait()
        await asyncio.gather(*(register(i) for i in infos))
        out.put(("register", time.perf_counter()))
        barrier.wait()
        await asyncio.gather(*(ask(i["rank"]) for i in infos))
        out.put(("first", time.perf_counter()))
        barrier.wait()
        await asyncio.gather(*(round_(i) for i in infos))
        out.put(("round", time.perf_counter()))


def _client_process(*args: Any) -> None:
    barrier, out = args[-2], args[-1]
    try:
        asyncio.run(_drive(*args))
    except BaseException as exc:
        out.put(("error", f"{type(exc).__name__}: {exc}"))
        barrier.abort()
        raise


def http_round(url: str, pid: int, job: dict, infos: list[dict], token: str) -> dict[str, float]:
    """Register the job and its talkers, hand out the first schedule, then time one round;
    wall seconds and coordinator CPU seconds per phase."""
    headers = {"authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, timeout=60, headers=headers) as client:
        r = client.post("/register_job", json=job)
        r.raise_for_status()
        job_id = r.json()
        headers[JOB_TOKEN_HEADER] = r.headers[JOB_TOKEN_HEADER]
    nproc = max(1, math.ceil(len(infos) / RANKS_PER_CLIENT_PROC))
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(nproc + 1, timeout=1800)
    out = ctx.Queue()
    procs = [
        ctx.Process(
            target=_client_process,
            args=(url, headers, job_id, infos[i::nproc], f"127.0.0.{2 + i}", barrier, out),
            daemon=True,
        )
        for i in range(nproc)
    ]
    for p in procs:
        p.start()
    figures: dict[str, float] = {}
    try:
        for phase in PHASES:
            before = cpu_seconds(pid)
            barrier.wait()
            t0 = time.perf_counter()
            ends = []
            for _ in range(nproc):
                kind, value = out.get(timeout=1800)
                if kind == "error":
                    raise SystemExit(f"a client process failed: {value}")
                ends.append(value)
            figures[f"{phase}_s"] = max(ends) - t0
            figures[f"{phase}_cpu_s"] = cpu_seconds(pid) - before
            print(
                f"  {len(infos):,} talking: {phase} {figures[f'{phase}_s']:.3f} s, coordinator CPU "
                f"{figures[f'{phase}_cpu_s']:.3f} s",
                file=sys.stderr,
            )
    finally:
        for p in procs:
            p.join(timeout=60)
    return figures
