"""Benchmark: does the deployed plan do what it promised? Predicted vs measured saving and
slowdown of the `Perseus` scheduler's plan, the base commit's scheduler and this tree's, in one run.

Usage::

    python benchmarks/bench_promise.py [--base 9b7afbb] [--rounds 90] [--budget 0.01]
        [--sensors real|ideal] [--jitter 0.02] [--seed 0]

Each scenario is a 4-rank job (1F1B, interleaved with 2 chunks, or zero-bubble with a split
backward; 8 microbatches, uneven stages, forwards of 10 ms at the max clock) on emulated
A100s in virtual time, whose GPUs switch clocks in ``switch`` ms (landing that long after
the instruction that asked, in wall time) and whose P2P hops take ``hop`` ms that no profile
holds. The ranks are `sensor_ranks.Ranks`, as in `bench_profile_fidelity.py`: the GPUs'
default, real-like sensors (an energy counter refreshing every 100 ms, polled as the hook
polls it; each instruction's energy is the coordinator's estimate from those windows, never
its own) and `JITTER` timing noise on every instruction (``--sensors ideal --jitter 0``:
exact per-instruction energy and no noise, the setting of this benchmark's earlier figures).
The scheduler runs as a user would start it: only ``{"max_slowdown": budget}``; it profiles,
plans and deploys online. Measured: the job's iteration time (slowest rank) and energy (all
GPUs, read from the counter as a rank reads it), medians of the last 10 rounds of the plan,
against the medians of 10 all-max rounds of the same length run on the same ranks.
Predicted: the deployed plan's own figures against the all-max plan scored by the same model.

``--base REF`` also runs the scheduler of commit REF, in a subprocess whose ``PYTHONPATH`` is
a `git worktree` of it (the same simulated ranks, loaded from this tree, drive both; a
commit whose client has no energy windows cannot be driven with real-like sensors).
"""

from __future__ import annotations

import argparse
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
JITTER = 0.02
"""Relative standard deviation of every instruction's time (and energy) around the model's."""


def _ranks(
    schedule: str, switch_ms: float, hop_ms: float, sensors: str, jitter: float, seed: int
) -> Any:
    """The scenario's simulated ranks (`sensor_ranks.Ranks`) and their truth: each (stage,
    kind, clock)'s time and power from the emulated A100's DVFS model."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from sensor_ranks import Ranks

    from perseus.domain.schedule import make_schedule
    from perseus.synth import stage_workloads
    from zeus_power.device import EmulatedGPU, VirtualClock
    from zeus_power.device.sensors import sensor_spec

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
    model = EmulatedGPU(0, gpu_type="A100-SXM", clock=VirtualClock())
    limit_w = model.power_limit_w()

    def truth(stage: int, kind: str, freq: int) -> tuple[float, float]:
        run = model.model.run(workloads[stage, kind], freq, limit_w)
        return run.time_s, run.power_w

    return Ranks(
        pipeline,
        truth,
        sensor_spec(sensors),
        seed=seed,
        gpu_type="A100-SXM",
        jitter=jitter,
        switch_latency_s=switch_ms / 1000,
        hop_latency_s=hop_ms / 1000,
    )


def _figures(results: list[Any]) -> tuple[float, float]:
    t = max(statistics.fmean(r.iter_time) for r in results)
    e = sum(statistics.fmean(r.iter_energy) for r in results)
    return t, e


def scenario(schedule: str, switch_ms: float, hop_ms: float, args: argparse.Namespace) -> dict:
    """Run one scenario with whatever `perseus` is importable; its figures."""
    from perseus.planning import make_plan, max_frequencies
    from perseus.protocol import FrequencySchedule
    from perseus.settings import PerseusSettings

    try:
        from perseus.schedulers.base import build_scheduler
        from perseus.schedulers.registry import resolve_scheduler
    except ImportError:  # a base commit from before the schedulers moved into perseus
        from schedulers.base import build_scheduler  # type: ignore[no-redef]
        from schedulers.registry import resolve_scheduler  # type: ignore[no-redef]

    ranks = _ranks(schedule, switch_ms, hop_ms, args.sensors, args.jitter, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        settings = PerseusSettings(scheduler="Perseus", dump_dir=tmp)
        scheduler = build_scheduler(
            resolve_scheduler("Perseus"),
            ranks.job_info("promise-job"),
            ranks.rank_infos(),
            settings,
            {"max_slowdown": args.budget},
        )
        per_round: list[tuple[tuple[float, float], list[list[int]], int]] = []
        for _ in range(args.rounds):
            schedules = scheduler.next_schedule()
            results, _true_j = ranks.run(schedules)
            scheduler.observe(results)
            ran = [[f for _, f in x.frequencies] for x in schedules]
            per_round.append((_figures(results), ran, schedules[0].steps or 1))
        plan = scheduler.deployed_plan()
        profile = scheduler.profile
    if plan is None or profile is None:
        return {"error": "no plan deployed"}
    deployed = [[f for _, f in rank] for rank in plan.frequencies]
    maxf = max_frequencies(profile, plan.pipeline_schedule())
    base_plan = getattr(scheduler, "baseline_plan", lambda: None)()
    if base_plan is None:  # the base commit scored all-max without switching or hops
        base_plan = make_plan(profile, plan.pipeline_schedule(), maxf, plan.p2p_power)
    if deployed == maxf:
        return {"error": "all-max at the end (held, or the guard fell back)"}
    # The plan's own rounds (not the all-max reference rounds a guard interleaves, nor an
    # earlier plan's).
    tail = [(f, steps) for f, ran, steps in per_round if ran == deployed][-MEASURED_ROUNDS:]
    if not tail:
        return {"error": "the deployed plan never ran"}
    # All-max measured on the same ranks, in rounds as long as the plan's.
    max_schedules = [
        FrequencySchedule(
            rank=r,
            frequencies=[(i.kind, f) for i, f in zip(order, fs, strict=True)],
            steps=tail[-1][1],
        )
        for r, (order, fs) in enumerate(zip(plan.pipeline_schedule().orders, maxf, strict=True))
    ]
    base = [_figures(ranks.run(max_schedules)[0]) for _ in range(MEASURED_ROUNDS)]
    t0 = statistics.median(t for t, _ in base)
    e0 = statistics.median(e for _, e in base)
    t1 = statistics.median(t for (t, _), _ in tail)
    e1 = statistics.median(e for (_, e), _ in tail)
    return {
        "deployed_at_end": per_round[-1][1] == deployed,
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
                    out[key] = scenario(schedule, switch, hop, args)
                except Exception as exc:  # a scenario the tree cannot run is a result too
                    out[key] = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(out))


def _run_tree(tree: Path, args: argparse.Namespace) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, __file__, "--worker", "--rounds", str(args.rounds)]
    cmd += ["--budget", str(args.budget), "--sensors", args.sensors]
    cmd += ["--jitter", str(args.jitter), "--seed", str(args.seed)]
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
    ap.add_argument("--base", default=None, help="also run this commit's scheduler")
    ap.add_argument("--rounds", type=int, default=90)
    ap.add_argument("--budget", type=float, default=0.01)
    ap.add_argument("--sensors", choices=("real", "ideal"), default="real")
    ap.add_argument("--jitter", type=float, default=JITTER)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        _worker(args)
        return
    before: dict[str, dict] = {}
    if args.base is not None:
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
        f"{args.sensors} sensors, {args.jitter:g} timing jitter, seed {args.seed}, "
        f"{args.rounds} rounds; saving and slowdown in %, predicted → measured\n"
    )

    def kept(r: dict) -> str:
        if "error" in r:
            return r["error"][:40]
        ok = r["measured_slowdown"] <= args.budget + 0.001 and r["measured_saving"] >= 0
        return "yes" if ok else "NO"

    def close(r: dict) -> bool:
        return "error" not in r and abs(r["measured_saving"] - r["predicted_saving"]) <= 0.01

    head = "| schedule | switch ms | hop ms |"
    if before:
        head += f" {args.base} saving | {args.base} slowdown |"
    print(head + " saving | slowdown | kept budget |")
    print("|---" * (head.count("|") + 2) + "|")
    for key, a in after.items():
        schedule, switch, hop = key.split("/")
        row = f"| {schedule} | {switch} | {hop} |"
        if before:
            b = before.get(key, {"error": "not run"})
            row += f" {_cell(b, 'saving')} | {_cell(b, 'slowdown')} |"
            row += f" {_cell(a, 'saving')} | {_cell(a, 'slowdown')} | {kept(b)} / {kept(a)} |"
        else:
            row += f" {_cell(a, 'saving')} | {_cell(a, 'slowdown')} | {kept(a)} |"
        print(row)
    n = len(after)
    print(
        f"\nbudget kept (slowdown ≤ budget + 0.1 point, saving ≥ 0): "
        f"{sum(kept(r) == 'yes' for r in after.values())} of {n}; measured saving within "
        f"1 point of predicted: {sum(close(r) for r in after.values())} of {n}; worst "
        "slowdown "
        + (
            f"{100 * max(r['measured_slowdown'] for r in after.values() if 'error' not in r):+.2f} %"
            if any("error" not in r for r in after.values())
            else "—"
        )
    )


if __name__ == "__main__":
    main()
