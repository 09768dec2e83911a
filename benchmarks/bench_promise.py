"""Benchmark: does the deployed plan do what it promised? Predicted vs measured saving and
slowdown of the `Perseus` scheduler's plan, the base commit's scheduler and this tree's, in one run.

Usage::

    python benchmarks/bench_promise.py [--base 9b7afbb] [--rounds 90] [--budget 0.01]

Each scenario is a 4-rank job (1F1B, interleaved with 2 chunks, or zero-bubble with a split
backward; 8 microbatches, uneven stages, forwards of 10 ms at the max clock) on emulated
A100s in virtual time (`perseus.demo.virtual.VirtualCluster`), whose GPUs switch clocks in
``switch`` ms and whose P2P hops take ``hop`` ms that no profile holds. The scheduler runs as
a user would start it: only ``{"max_slowdown": budget}``; it profiles, plans and deploys
online. Measured: the job's iteration time (slowest rank) and energy (all GPUs), medians of
the last 10 rounds, against the medians of 10 all-max rounds run on the same cluster.
Predicted: the deployed plan's own figures against the all-max plan scored by the same model.

The base commit's scheduler runs in a subprocess whose ``PYTHONPATH`` is a `git worktree` of
that commit (the same `VirtualCluster` code, loaded from this tree, drives both).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCHEDULES = ("1f1b", "interleaved", "zb")
SWITCH_MS = (0.0, 15.0)
HOP_MS = (0.0, 2.0)
WORK = [1.0, 1.6, 1.0, 1.2]
MEASURED_ROUNDS = 10


def _virtual() -> Any:
    """`perseus.demo.virtual` of THIS tree, whatever tree `perseus` is imported from."""
    name = "bench_promise_virtual"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "perseus" / "demo" / "virtual.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _cluster(schedule: str, switch_ms: float, hop_ms: float) -> Any:
    from perseus.domain.schedule import make_schedule
    from perseus.synth import stage_workloads

    pipeline = make_schedule(schedule, 4, 8, num_chunks=2)
    work = WORK * (pipeline.num_virtual_stages // len(WORK))
    scale = len(WORK) / pipeline.num_virtual_stages
    workloads = {}
    for stage, (fwd, bwd) in enumerate(
        stage_workloads("A100-SXM", work, base_forward_ms=10.0 * scale)
    ):
        workloads[stage, "forward"] = fwd
        workloads[stage, "backward"] = bwd
        half = bwd.scaled(0.5)
        workloads[stage, "backward_input"] = half
        workloads[stage, "backward_weight"] = half
    return _virtual().VirtualCluster(
        pipeline,
        workloads,
        gpu_type="A100-SXM",
        switch_latency_s=switch_ms / 1000,
        hop_latency_s=hop_ms / 1000,
    )


def _figures(results: list[Any]) -> tuple[float, float]:
    t = max(statistics.fmean(r.iter_time) for r in results)
    e = sum(statistics.fmean(r.iter_energy) for r in results)
    return t, e


def scenario(schedule: str, switch_ms: float, hop_ms: float, rounds: int, budget: float) -> dict:
    """Run one scenario with whatever `perseus`/`schedulers` is importable; its figures."""
    from perseus.planning import make_plan, max_frequencies
    from perseus.settings import PerseusSettings
    from schedulers.base import build_scheduler
    from schedulers.registry import resolve_scheduler

    cluster = _cluster(schedule, switch_ms, hop_ms)
    with tempfile.TemporaryDirectory() as tmp:
        settings = PerseusSettings(scheduler="Perseus", dump_dir=tmp)
        scheduler = build_scheduler(
            resolve_scheduler("Perseus"),
            cluster.job_record(),
            cluster.rank_infos(),
            settings,
            {"max_slowdown": budget},
        )
        per_round: list[tuple[tuple[float, float], list[list[int]]]] = []

        def keep(_: int, schedules: list[Any], results: list[Any]) -> None:
            per_round.append(
                (_figures(results), [[f for _, f in x.frequencies] for x in schedules])
            )

        history = _virtual().run_rounds(scheduler, cluster, rounds, on_round=keep)
        plan = scheduler.deployed_plan()
        ran = [[f for _, f in s.frequencies] for s in history[-1]]
        profile = scheduler.profile
    if plan is None or profile is None:
        return {"error": "no plan deployed"}
    deployed = [[f for _, f in rank] for rank in plan.frequencies]
    maxf = max_frequencies(profile, plan.pipeline_schedule())
    base_plan = getattr(scheduler, "baseline_plan", lambda: None)()
    if base_plan is None:  # the base commit scored all-max without switching or hops
        base_plan = make_plan(profile, plan.pipeline_schedule(), maxf, plan.p2p_power)
    # All-max measured on the same cluster (same clocks; rounds of the all-max plan).
    from perseus.protocol import FrequencySchedule

    max_schedules = [
        FrequencySchedule(rank=r, frequencies=[(i.kind, f) for i, f in zip(order, fs, strict=True)])
        for r, (order, fs) in enumerate(zip(plan.pipeline_schedule().orders, maxf, strict=True))
    ]
    base = [_figures(cluster.run_round(max_schedules)) for _ in range(MEASURED_ROUNDS)]
    t0 = statistics.median(t for t, _ in base)
    e0 = statistics.median(e for _, e in base)
    # The plan's own rounds (not the all-max reference rounds a guard interleaves).
    tail = [f for f, ran in per_round if ran != maxf][-MEASURED_ROUNDS:]
    t1 = statistics.median(t for t, _ in tail)
    e1 = statistics.median(e for _, e in tail)
    return {
        "deployed_at_end": ran == deployed,
        "predicted_saving": 1 - plan.energy / base_plan.energy,
        "predicted_slowdown": plan.iteration_time / base_plan.iteration_time - 1,
        "measured_saving": 1 - e1 / e0,
        "measured_slowdown": t1 / t0 - 1,
    }


def _worker(args: argparse.Namespace) -> None:
    out = {}
    for schedule in SCHEDULES:
        for switch in SWITCH_MS:
            for hop in HOP_MS:
                key = f"{schedule}/{switch:g}/{hop:g}"
                try:
                    out[key] = scenario(schedule, switch, hop, args.rounds, args.budget)
                except Exception as exc:  # a scenario the tree cannot run is a result too
                    out[key] = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(out))


def _run_tree(tree: Path, args: argparse.Namespace) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, __file__, "--worker", "--rounds", str(args.rounds)]
    cmd += ["--budget", str(args.budget)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cell(r: dict, which: str) -> str:
    if "error" in r:
        return "—"
    return f"{100 * r[f'predicted_{which}']:+.2f} → {100 * r[f'measured_{which}']:+.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="9b7afbb", help="the commit to compare with")
    ap.add_argument("--rounds", type=int, default=90)
    ap.add_argument("--budget", type=float, default=0.01)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        _worker(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        base_tree = Path(tmp) / "base"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base_tree), args.base],
            check=True,
            capture_output=True,
        )
        try:
            before = _run_tree(base_tree, args)
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_tree)],
                check=False,
                capture_output=True,
            )
    after = _run_tree(ROOT, args)
    print(
        f"Perseus with only max_slowdown={args.budget:g}; emulated A100s, virtual time, "
        f"{args.rounds} rounds; saving and slowdown in %, predicted → measured\n"
    )
    print(
        f"| schedule | switch ms | hop ms | {args.base} saving | {args.base} slowdown "
        "| this tree saving | this tree slowdown | kept budget (before / now) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for key in before:
        schedule, switch, hop = key.split("/")
        b, a = before[key], after[key]

        def kept(r: dict) -> str:
            if "error" in r:
                return r["error"][:40]
            ok = r["measured_slowdown"] <= args.budget + 0.001 and r["measured_saving"] >= 0
            return "yes" if ok else "NO"

        print(
            f"| {schedule} | {switch} | {hop} | {_cell(b, 'saving')} | {_cell(b, 'slowdown')} "
            f"| {_cell(a, 'saving')} | {_cell(a, 'slowdown')} | {kept(b)} / {kept(a)} |"
        )


if __name__ == "__main__":
    main()
