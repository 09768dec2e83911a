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
import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from coordinator_clients import http_round, talkers  # this folder is on sys.path
from coordinator_fanout import fanout_timings, fit, gathered, tree_hops

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this tree's perseus, here and in the processes spawned
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p
)
BASE_COMMIT = "9b7afbb"
"""The commit before leaders: every rank talks to the coordinator."""
TARGETS = {16_384: (1.0, 0.5), 4096: (0.5, None)}
"""GPUs → (round wall time, coordinator CPU) targets, s."""


# ---------------------------------------------------------------------------- plumbing
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
