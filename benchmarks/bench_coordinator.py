"""Benchmark: one scheduling round of a whole job on one Perseus coordinator, 1,024 to 65,536 GPUs.

Each size is a tp 8 × pp 16 × dp N job (Llama 3 405B's layout at 16,384 GPUs), run two ways
in one run, each on a fresh coordinator (``python -m perseus serve`` in a subprocess on
loopback, auth on: ``--token``, and each job's credential):

- **base** (`--baseline`, default the commit before leaders, through a temporary ``git
  worktree``): every rank talks, as that commit's clients do. Simulated ranks (asyncio, one
  `httpx.AsyncClient` and one connection per rank, as every rank of a real job owns its
  client; spread over client processes with a barrier per phase) register, ask for the
  first schedule, then run the timed round: each posts its ``ProfilingResult`` and asks for
  the next schedule (the long-poll that ends when the last rank has asked).
- **leaders** (this tree): only the pp × `--leaders-per-stage` leaders talk over HTTP, each
  posting its group's folded result (one `ReplicaFigures` per replica) and asking, as
  above. The round's in-job part, which no coordinator sees, is counted too: before its
  post a leader folds its group's round in (`JobFanOut.gather`: a gloo ``gather`` from each
  replica's tp ranks to its head, then one from the block's B = dp / leaders_per_stage
  heads to the leader), after its answer it hands the schedule out (`JobFanOut.hand_out`:
  the same two levels of gloo ``broadcast``, header and payload). One level runs for real,
  on `--fanout-procs` local processes in one gloo group with the real result and schedule
  payloads, and is extrapolated with gloo's own algorithms: a gather's root receives n − 1
  messages, a binomial-tree broadcast takes ⌈log2 n⌉ sequential hops. The fixed cost and
  the cost per message or hop are a least-squares fit of the local timings; the fold is
  2 × fixed + per message × ((tp − 1) + (B − 1)), the hand-out 2 × fixed + per hop ×
  (⌈log2 tp⌉ + ⌈log2 B⌉). Local processes share this machine's two cores, so their
  per-message cost (hundreds of µs, mostly waiting to be scheduled) is an upper bound on
  a cluster's rather than an estimate of it.

A round's wall time is, for base, from the first post to the last schedule received; for
leaders, the fold + that HTTP round + the hand-out. The coordinator's CPU seconds (user +
system, ``/proc/<pid>/stat``) over the round are the server's cost whatever the simulated
clients cost on this machine. Targets (auth on): 16,384 GPUs ≤ 1 s per round and ≤ 0.5 s of
coordinator CPU; 4,096 ≤ 0.5 s.

A base size whose ranks would need more connections than one process may hold
(``ulimit -Hn``: the coordinator holds one per rank) is not run; its figures are printed
extrapolated from the largest base size run (CPU per rank per round, constant), and marked so.

    python benchmarks/bench_coordinator.py [--ranks 1024 4096 16384 65536] [--tp 8] [--pp 16]
        [--microbatches 16] [--leaders-per-stage 1] [--token T] [--baseline COMMIT | --no-baseline]
        [--fanout-procs 2 3 4] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing
import os
import resource
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this tree's perseus, here and in the processes spawned
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p
)
BASE_COMMIT = "9b7afbb"
"""The commit before leaders: every rank talks to the coordinator."""
JOB_TOKEN_HEADER = "X-Perseus-Job-Token"
TARGETS = {16_384: (1.0, 0.5), 4096: (0.5, None)}
"""GPUs → (round wall time, coordinator CPU) targets, s."""
RANKS_PER_CLIENT_PROC = 6000
"""Simulated ranks per client process (each holds one connection per rank)."""
FREQS = list(range(1410, 200, -15))  # an A100's 81 SM clocks


# ---------------------------------------------------------------------------- plumbing
def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(
    url: str, headers: dict[str, str], proc: subprocess.Popen, timeout_s: float = 60
) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=url, headers=headers, timeout=5) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"the coordinator exited with {proc.returncode}")
            with contextlib.suppress(httpx.TransportError):
                if client.get("/info").status_code == 200:
                    return
            time.sleep(0.1)
    raise SystemExit("the coordinator did not start")


@contextlib.contextmanager
def coordinator(tree: Path, args: argparse.Namespace):
    """A fresh ``perseus serve`` from source tree `tree`; yields (url, pid)."""
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "PERSEUS_SCHEDULER": args.scheduler,
        "PERSEUS_SCHEDULER_ARGS": json.dumps({"num_microbatches": args.microbatches}),
        "PERSEUS_DUMP_DATA": "false",
        "PERSEUS_TOKEN": args.token,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "perseus", "serve", "--port", str(port), "--log-level", "warning"],
        env=env,
        cwd=tree,
        stdout=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_up(url, {"authorization": f"Bearer {args.token}"}, proc)
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=60)


# ---------------------------------------------------------------------------- payloads
def place(rank: int, pp: int, tp: int) -> tuple[int, int, int]:
    """(dp, pp, tp) of `rank`: rank = (dp·pp + pp_rank)·tp + tp_rank."""
    return rank // (pp * tp), (rank // tp) % pp, rank % tp


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
    if not leaders:
        infos = []
        for r in range(ranks):
            d, p, t = place(r, pp, tp)
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
    from perseus.protocol import PROTOCOL_VERSION, Leaders, ParallelLayout

    job |= {"protocol_version": PROTOCOL_VERSION, "leaders_per_stage": args.leaders_per_stage}
    rule = Leaders(ParallelLayout(dp, pp, tp), args.leaders_per_stage)
    infos = [
        {
            "rank": (d * pp + p) * tp,
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
            assert body["rank"] == rank
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


# ---------------------------------------------------------------------------- the fan-out
def _fanout_rank(rank: int, world: int, store: str, microbatches: int, reps: int, out: Any) -> None:
    """One process of the local fan-out timing: `reps` folds and hand-outs of a real round."""
    import torch
    import torch.distributed as dist

    from perseus.client.leaders import JobFanOut
    from perseus.protocol import FrequencySchedule, ParallelLayout, ProfilingResult

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    fanout = JobFanOut(
        dist,
        rank=rank,
        dp_rank=rank,
        pp_rank=0,
        tp_rank=0,
        layout=ParallelLayout(world, 1, 1),
        per_stage=1,
        steps_per_round=1,
        pipeline_key="bench",
        gpu_name="bench",
        frequencies=FREQS,
        emulated=True,
        switch_latency_s=None,
        timeout_s=120,
    )
    order = ["forward", "backward"] * microbatches
    result = ProfilingResult.model_validate(result_body(rank, [(k, 1410) for k in order], None))
    schedule = FrequencySchedule(rank=0, frequencies=[(k, 1005) for k in order])
    folds, handouts = [], []
    for rep in range(reps):
        dist.barrier()
        t0 = time.monotonic()
        fanout.gather(result)
        t1 = time.monotonic()
        if fanout.is_leader:
            fanout.hand_out(rep, schedule)
        else:
            fanout.receive(rep)
        t2 = time.monotonic()
        ends = [torch.zeros(2, dtype=torch.float64) for _ in range(world)]
        dist.all_gather(ends, torch.tensor([t1, t2], dtype=torch.float64))
        if rank == 0:
            folds.append(t1 - t0)
            handouts.append(max(float(e[1]) for e in ends) - t1)
    if rank == 0:
        out.put((statistics.median(folds[1:]), statistics.median(handouts[1:])))
    dist.destroy_process_group()


def fanout_timings(
    procs: list[int], microbatches: int, reps: int = 15
) -> dict[int, tuple[float, float]]:
    """Processes → (fold s, hand-out s), medians over `reps` rounds (the first dropped)."""
    ctx = multiprocessing.get_context("spawn")
    timings = {}
    for world in procs:
        out = ctx.Queue()
        with tempfile.TemporaryDirectory() as tmp:  # a file store: no port to race for
            store = str(Path(tmp) / "store")
            ps = [
                ctx.Process(target=_fanout_rank, args=(r, world, store, microbatches, reps, out))
                for r in range(world)
            ]
            for p in ps:
                p.start()
            timings[world] = out.get(timeout=600)
            for p in ps:
                p.join(timeout=60)
        print(
            f"  fan-out on {world} local processes: fold {1000 * timings[world][0]:.2f} ms, "
            f"hand-out {1000 * timings[world][1]:.2f} ms",
            file=sys.stderr,
        )
    return timings


def gathered(n: int) -> int:
    """Messages the root of a gloo gather over n ranks receives (one from every other)."""
    return n - 1


def tree_hops(n: int) -> int:
    """Sequential hops of gloo's binomial-tree broadcast over n ranks."""
    return math.ceil(math.log2(n)) if n > 1 else 0


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares (fixed s, s per step) of (steps, seconds), the slope at least 0."""
    xs, ys = [x for x, _ in points], [y for _, y in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = max(0.0, sum((x - mx) * (y - my) for x, y in points) / var) if var else 0.0
    return max(0.0, my - slope * mx), slope


# ---------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1024, 4096, 16_384, 65_536])
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--pp", type=int, default=16)
    parser.add_argument("--microbatches", type=int, default=16)
    parser.add_argument("--leaders-per-stage", type=int, default=1)
    parser.add_argument("--scheduler", default="AllMaxFrequency")
    parser.add_argument("--token", default="bench-token-0123456789")
    parser.add_argument("--baseline", default=BASE_COMMIT)
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--fanout-procs", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument("--json", type=Path, help="Also write every figure here")
    args = parser.parse_args()
    for n in args.ranks:
        if n % (args.pp * args.tp):
            raise SystemExit(f"--ranks {n} must be a multiple of pp × tp = {args.pp * args.tp}")
    fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    with contextlib.suppress(ValueError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))

    print("In-job fan-out, timed on local processes (gloo):", file=sys.stderr)
    local = fanout_timings(args.fanout_procs, args.microbatches)
    fold_model = fit([(gathered(p), t[0]) for p, t in local.items()])
    hand_model = fit([(tree_hops(p), t[1]) for p, t in local.items()])

    rows: list[dict[str, Any]] = []
    base_tree: Path | None = None
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as cleanup:
        if not args.no_baseline:
            base_tree = Path(tmp) / "base"
            subprocess.run(
                ["git", "worktree", "add", "--detach", "-q", str(base_tree), args.baseline],
                cwd=REPO,
                check=True,
            )
            cleanup.callback(
                subprocess.run,
                ["git", "worktree", "remove", "--force", str(base_tree)],
                cwd=REPO,
                check=False,
            )
        for ranks in args.ranks:
            dp = ranks // (args.pp * args.tp)
            row: dict[str, Any] = {"ranks": ranks, "tp": args.tp, "pp": args.pp, "dp": dp}
            if base_tree is not None:
                if ranks + 100 > fd_limit:
                    row["base"] = None
                else:
                    print(
                        f"{ranks:,} GPUs, base ({args.baseline}): every rank talks", file=sys.stderr
                    )
                    job, infos = talkers(args, ranks, leaders=False)
                    with coordinator(base_tree, args) as (url, pid):
                        figures = http_round(url, pid, job, infos, args.token)
                    row["base"] = {
                        "talking": len(infos),
                        "register_s": figures["register_s"],
                        "round_s": figures["round_s"],
                        "cpu_s": figures["round_cpu_s"],
                    }
            print(f"{ranks:,} GPUs, leaders (this tree)", file=sys.stderr)
            job, infos = talkers(args, ranks, leaders=True)
            with coordinator(REPO, args) as (url, pid):
                figures = http_round(url, pid, job, infos, args.token)
            heads = dp // args.leaders_per_stage
            group = heads * args.tp
            fold_s = 2 * fold_model[0] + fold_model[1] * (gathered(args.tp) + gathered(heads))
            hand_s = 2 * hand_model[0] + hand_model[1] * (tree_hops(args.tp) + tree_hops(heads))
            row["leaders"] = {
                "talking": len(infos),
                "group": group,
                "register_s": figures["register_s"],
                "http_round_s": figures["round_s"],
                "fold_s": fold_s,
                "hand_out_s": hand_s,
                "round_s": fold_s + figures["round_s"] + hand_s,
                "cpu_s": figures["round_cpu_s"],
            }
            rows.append(row)
    measured = [r for r in rows if r.get("base")]
    for row in rows:
        if base_tree is not None and row["base"] is None and measured:
            ref = measured[-1]
            scale = row["ranks"] / ref["ranks"]
            row["base"] = {
                "talking": row["ranks"],
                "round_s": ref["base"]["round_s"] * scale,
                "cpu_s": ref["base"]["cpu_s"] * scale,
                "extrapolated_from": ref["ranks"],
            }
    report(args, rows, local, fold_model, hand_model, fd_limit)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "rows": rows,
                    "fanout_local": {str(k): v for k, v in local.items()},
                    "fold_model": fold_model,
                    "hand_out_model": hand_model,
                },
                indent=1,
            )
            + "\n"
        )


def report(
    args: argparse.Namespace,
    rows: list[dict[str, Any]],
    local: dict[int, tuple[float, float]],
    fold_model: tuple[float, float],
    hand_model: tuple[float, float],
    fd_limit: int,
) -> None:
    print(
        f"\nIn-job fan-out model (gloo, fit on {', '.join(map(str, local))} local processes): fold "
        f"{1000 * fold_model[0]:.2f} ms + {1e6 * fold_model[1]:.1f} µs per message (a gather: "
        f"n − 1 to its root), hand-out {1000 * hand_model[0]:.2f} ms + "
        f"{1e6 * hand_model[1]:.1f} µs per tree hop (⌈log2 n⌉); each in two levels, tp ranks → "
        "replica head → leader"
    )
    print(
        f"\nOne round, auth on, tp {args.tp} × pp {args.pp} × dp N, {args.microbatches} "
        f"microbatches, {args.leaders_per_stage} leader(s) per stage; base = {args.baseline}\n"
    )
    print(
        "| GPUs (dp) | base: talking, round wall, coordinator CPU | leaders: talking, group, "
        "fold + HTTP + hand-out = round wall, coordinator CPU | wall, CPU vs base | target |"
    )
    print("|---|---|---|---|---|")
    for row in rows:
        base, new = row.get("base"), row["leaders"]
        if base is None:
            base_text, ratio = "—", "—"
        else:
            mark = "*" if "extrapolated_from" in base else ""
            base_text = (
                f"{base['talking']:,}, {base['round_s']:.2f} s{mark}, {base['cpu_s']:.2f} s{mark}"
            )
            ratio = f"{new['round_s'] / base['round_s']:.3f}, {new['cpu_s'] / base['cpu_s']:.4f}"
        target = TARGETS.get(row["ranks"])
        if target is None:
            verdict = ""
        else:
            wall_t, cpu_t = target
            ok = new["round_s"] <= wall_t and (cpu_t is None or new["cpu_s"] <= cpu_t)
            limits = f"≤ {wall_t:g} s" + (f", ≤ {cpu_t:g} s CPU" if cpu_t is not None else "")
            verdict = f"{limits}: {'met' if ok else 'MISSED'}"
        print(
            f"| {row['ranks']:,} ({row['dp']}) | {base_text} | {new['talking']}, {new['group']}, "
            f"{1000 * new['fold_s']:.0f} + {1000 * new['http_round_s']:.0f} + "
            f"{1000 * new['hand_out_s']:.1f} ms = {new['round_s']:.3f} s, "
            f"{1000 * new['cpu_s']:.0f} ms | {ratio} | {verdict} |"
        )
    extrapolated = [r for r in rows if r.get("base") and "extrapolated_from" in r["base"]]
    if extrapolated:
        ref = extrapolated[0]["base"]["extrapolated_from"]
        print(
            f"\n* not run: {extrapolated[0]['ranks']:,} connections at once exceed the "
            f"{fd_limit:,} file descriptors a process may hold here (ulimit -Hn); scaled from "
            f"{ref:,} GPUs at the same CPU and wall time per rank."
        )
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
