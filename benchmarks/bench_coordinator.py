"""Benchmark: one scheduling round of the Perseus coordinator for many simulated ranks.

Starts the real coordinator (``python -m perseus serve``) in a subprocess on a loopback
port, registers one job of `--ranks` ranks (pp × dp), then times one round: every rank
asks ``GET /schedule`` at once (asyncio; one `httpx.AsyncClient` per rank, as every rank
of a real job owns its client — one shared client would measure httpcore's connection
pool, whose bookkeeping grows quadratically with 1000 concurrent requests) and the round
ends when all have their schedule. A second round, with every rank's
`ProfilingResult` posted first, times the observe path too.

Beside the wall-clock time (which, on one machine, includes the simulated ranks' own
client work), the coordinator process's CPU seconds (user + system, from
``/proc/<pid>/stat``) per rank per round: the server's cost, whatever the clients cost.
Each size in `--ranks` gets a fresh coordinator; with `--baseline COMMIT` the same sizes
run on that commit's coordinator too (a temporary git worktree), alternating, and the
ratios (this tree / baseline) are printed. Target: one round for 4,096 ranks in ≤ 2 s.

With `--token T` every request carries ``Authorization: Bearer T`` and the coordinator it
starts gets ``PERSEUS_TOKEN=T``; a job credential returned by ``/register_job`` in the
``X-Perseus-Job-Token`` header is sent back on every request under the job id.

    python benchmarks/bench_coordinator.py [--ranks 1024 4096] [--pp 8] [--microbatches 8]
        [--token T] [--baseline COMMIT] [--url http://host:port]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

TARGET_S = 2.0
TARGET_RANKS = 4096
REPO = Path(__file__).resolve().parents[1]
JOB_TOKEN_HEADER = "X-Perseus-Job-Token"


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of process `pid` (Linux /proc), None if unknown."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(client: httpx.Client, proc: subprocess.Popen | None, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"coordinator exited with {proc.returncode}")
        try:
            if client.get("/info").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise SystemExit("coordinator did not start")


PHASES = ("register", "round", "report", "round_with_observe")


async def _drive(
    base_url: str, headers: dict, job_id: str, pp: int, ranks: list[int], barrier, out
) -> None:
    """One client process: its slice of ranks through every phase, in step with the others
    (a phase starts when every process and the parent have reached the barrier)."""
    tls = ssl.create_default_context()  # one context for all clients (loopback: unused)
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    clients = {
        r: httpx.AsyncClient(
            base_url=base_url, timeout=300, verify=tls, headers=headers, limits=limits
        )
        for r in ranks
    }
    freqs = list(range(1410, 200, -15))
    sem = asyncio.Semaphore(256)
    async with contextlib.AsyncExitStack() as stack:
        for c in clients.values():
            await stack.enter_async_context(c)

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

        async def ask(rank: int) -> list:
            r = await clients[rank].get(f"/schedule/{job_id}", params={"rank": rank})
            r.raise_for_status()
            body = r.json()
            assert body["rank"] == rank
            return body["frequencies"]

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

        barrier.wait()
        await asyncio.gather(*(register(r) for r in ranks))
        out.put(("register", time.perf_counter()))
        barrier.wait()
        schedules = await asyncio.gather(*(ask(r) for r in ranks))
        out.put(("round", time.perf_counter()))
        barrier.wait()
        await asyncio.gather(*(report(r, f) for r, f in zip(ranks, schedules, strict=True)))
        out.put(("report", time.perf_counter()))
        barrier.wait()
        await asyncio.gather(*(ask(r) for r in ranks))
        out.put(("round_with_observe", time.perf_counter()))


def _client_process(*args: object) -> None:
    barrier, out = args[-2], args[-1]
    try:
        asyncio.run(_drive(*args))  # type: ignore[arg-type]
    except BaseException as exc:
        out.put(("error", f"{type(exc).__name__}: {exc}"))  # type: ignore[attr-defined]
        barrier.abort()  # type: ignore[attr-defined]
        raise


def run(args: argparse.Namespace, ranks: int, base_url: str, proc: subprocess.Popen | None) -> dict:
    """One job of `ranks` ranks driven by `args.client_procs` client processes."""
    pp = args.pp
    dp = ranks // pp
    world = pp * dp
    pid = proc.pid if proc is not None else None
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    with httpx.Client(base_url=base_url, timeout=60, headers=headers) as client:
        wait_up(client, proc)
        job = {"pp_degree": pp, "dp_degree": dp, "tp_degree": 1, "world_size": world}
        r = client.post("/register_job", json=job)
        r.raise_for_status()
        job_id = r.json()
        if JOB_TOKEN_HEADER in r.headers:
            headers[JOB_TOKEN_HEADER] = r.headers[JOB_TOKEN_HEADER]
    nproc = max(1, min(args.client_procs, world))
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(nproc + 1, timeout=600)
    out = ctx.Queue()
    procs = [
        ctx.Process(
            target=_client_process,
            args=(base_url, headers, job_id, pp, list(range(i, world, nproc)), barrier, out),
            daemon=True,
        )
        for i in range(nproc)
    ]
    for p in procs:
        p.start()
    seconds: dict[str, float] = {}
    cpu: dict[str, float | None] = {}
    try:
        for phase in PHASES:
            before = cpu_seconds(pid)
            barrier.wait()
            t0 = time.perf_counter()
            ends = []
            for _ in range(nproc):
                kind, value = out.get(timeout=600)
                if kind == "error":
                    raise SystemExit(f"a client process failed: {value}")
                ends.append(value)
            seconds[phase] = max(ends) - t0
            after = cpu_seconds(pid)
            cpu[phase] = None if before is None or after is None else after - before
            print(f"{world} ranks, {phase}: {seconds[phase]:.2f} s", file=sys.stderr)
    finally:
        for p in procs:
            p.join(timeout=30)

    def per_rank_ms(*phases: str) -> float | None:
        values = [cpu[p] for p in phases]
        if any(v is None for v in values):
            return None
        return round(1000 * sum(values) / world, 4)  # type: ignore[arg-type]

    round_s = seconds["round"]
    return {
        "ranks": world,
        "pp": pp,
        "dp": dp,
        "microbatches": args.microbatches,
        "scheduler": args.scheduler,
        "auth": bool(args.token),
        "client_procs": nproc,
        "register_all_s": round(seconds["register"], 3),
        "round_s": round(round_s, 3),
        "report_all_s": round(seconds["report"], 3),
        "round_with_observe_s": round(seconds["round_with_observe"], 3),
        "server_cpu_ms_per_rank_round": per_rank_ms("round"),
        "server_cpu_ms_per_rank_round_with_observe": per_rank_ms("report", "round_with_observe"),
        "target_s": TARGET_S if world >= TARGET_RANKS else None,
        "meets_target": round_s <= TARGET_S if world >= TARGET_RANKS else None,
    }


def serve_and_run(args: argparse.Namespace, ranks: int, tree: Path) -> dict:
    """One size on a fresh coordinator started from source tree `tree`."""
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(tree), os.environ.get("PYTHONPATH", "")) if p
        ),
        "PERSEUS_SCHEDULER": args.scheduler,
        "PERSEUS_SCHEDULER_ARGS": json.dumps({"num_microbatches": args.microbatches}),
        "PERSEUS_DUMP_DATA": "false",
    }
    if args.token:
        env["PERSEUS_TOKEN"] = args.token
    proc = subprocess.Popen(
        [sys.executable, "-m", "perseus", "serve", "--port", str(port), "--log-level", "warning"],
        env=env,
        cwd=tree,
        stdout=subprocess.DEVNULL,
    )
    try:
        return run(args, ranks, f"http://127.0.0.1:{port}", proc)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--pp", type=int, default=8)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--scheduler", default="AllMaxFrequency")
    parser.add_argument(
        "--client-procs",
        type=int,
        default=1,
        help="Processes that drive the simulated ranks (use several on a many-core machine, "
        "so that the clients are not what is measured).",
    )
    parser.add_argument("--token", help="Bearer token (also given to the coordinator started).")
    parser.add_argument("--baseline", help="Also run this git commit's coordinator; print ratios.")
    parser.add_argument(
        "--url", help="Use a coordinator already running there (its own PERSEUS_* settings)."
    )
    args = parser.parse_args()
    for n in args.ranks:
        if n % args.pp:
            raise SystemExit(f"--ranks {n} must be a multiple of --pp {args.pp}")
    if args.url:
        for n in args.ranks:
            report(run(args, n, args.url, None))
        return
    if args.baseline is None:
        for n in args.ranks:
            report(serve_and_run(args, n, REPO))
        return
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "baseline"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-q", str(old), args.baseline],
            cwd=REPO,
            check=True,
        )
        try:
            for n in args.ranks:
                base = serve_and_run(args, n, old)
                base["tree"] = args.baseline
                report(base)
                new = serve_and_run(args, n, REPO)
                report(new)
                ratios = {
                    k: round(new[k] / base[k], 2)
                    for k in ("round_s", "round_with_observe_s", "server_cpu_ms_per_rank_round")
                    if base.get(k) and new.get(k) is not None
                }
                print(f"{n} ranks, this tree / {args.baseline}: {json.dumps(ratios)}")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=REPO)


def report(out: dict) -> None:
    print(json.dumps(out))
    cpu = out["server_cpu_ms_per_rank_round"]
    cpu_text = "" if cpu is None else f"; server CPU {cpu:.3f} ms per rank per round"
    status = ""
    if out["meets_target"] is not None:
        status = " — " + ("OK" if out["meets_target"] else "MISSED")
        status = f" (target ≤ {TARGET_S:.0f} s){status}"
    print(
        f"{out['ranks']} ranks ({out['pp']} stages × {out['dp']} pipelines): one round "
        f"{out['round_s']:.2f} s, with observe {out['round_with_observe_s']:.2f} s"
        f"{cpu_text}{status}"
    )


if __name__ == "__main__":
    main()
