"""Benchmark: the frontier solver at 16 stages against a base commit, and against lowtime.

Usage::

    python benchmarks/bench_solver_scale.py [--base 9b7afbb] [--cases 1f1b:16x128,1f1b:16x256,zb:16x128]
                                            [--small 8x24] [--repeat-small 3] [--no-base]

Every figure is measured in this one run, each solve in a child process of its own (its
wall time includes Python's start and the imports; its CPU time, in brackets, is the
child's user + system time, which a busy shared host disturbs less; its peak memory is
the child's ``ru_maxrss``). Both trees are byte-compiled first, as pip leaves an
installed package (lowtime's included): where ``PYTHONDONTWRITEBYTECODE`` is set, as on
this machine, every child would otherwise compile the tree from source (~0.08 s).

1. The 16-stage synthetic H100 profile (`perseus profile synth --gpu H100-SXM --stages 16
   --work 1,1.1,0.9,1,1,1.05,0.95,1,1,1.1,1,0.9,1,1,1.05,0.8`, 110 clocks) is written to a
   temporary directory. For every case ``SCHEDULE:SxM`` (``zb`` splits the backward rows
   in halves, as ``perseus solve --split-backward 0.5`` does) the whole frontier
   (``solve_frontier(..., max_points=None)``) is solved by the base commit (a temporary
   ``git worktree`` of ``--base``) and by this tree, and the worst energy difference over
   every deadline is printed: at each point of either frontier, this tree's cheapest plan
   with ``T ≤`` that time against the base's (positive: this tree uses more energy).
   Then `perseus solve --no-plots` itself (500 plans written) is timed on this tree.
2. The small end: `perseus solve --no-plots` at ``--small`` on the real GPT-3 A40 profile
   (``../shared/data``), best of ``--repeat-small`` (this tree and the base), against
   lowtime 0.3.0 on the same DAG (`lowtime_baseline.py`, a child process, imports
   included).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
A40 = ROOT.parent / "shared" / "data" / "sosp24_gpt3-175b_a40_8stage.csv"
WORK = "1,1.1,0.9,1,1,1.05,0.95,1,1,1.1,1,0.9,1,1,1.05,0.8"

DRIVER = """
import sys, numpy as np
from perseus.io.profile_csv import load_profile
from perseus.domain.schedule import make_schedule
from perseus.planning import solve_frontier
from perseus.planning.gpu import blocking_power
path, name, S, M, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
profile = load_profile(path)
if name == "zb":
    profile = profile.split_backward(0.5)
frontier = solve_frontier(profile, make_schedule(name, S, M),
                          p2p_power_w=blocking_power(profile, None).watts, max_points=None)
np.savez(out, time_s=[p.iteration_time_s for p in frontier.points],
         energy_j=[p.energy_j for p in frontier.points],
         bound_j=[p.lower_bound_j for p in frontier.points],
         breakpoints=frontier.stats.get("lp_breakpoints", 0))
"""

LOWTIME = """
import sys
sys.path.insert(0, sys.argv[1])
from lowtime_baseline import run_lowtime
from perseus.io.profile_csv import load_profile
from perseus.domain.schedule import make_schedule
S, M = int(sys.argv[3]), int(sys.argv[4])
run_lowtime(load_profile(sys.argv[2]), make_schedule("1f1b", S, M), p2p_power_w=70.38)
"""


@dataclass
class Run:
    wall_s: float
    cpu_s: float
    peak_mb: float


def run_child(cmd: list[str], tree: Path) -> Run:
    """Run `cmd` with `tree` first on the path; its wall time, CPU time and peak RSS."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed in {tree}:\n{err[-2000:]}")
    return Run(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024)


def worst_difference(base: np.lib.npyio.NpzFile, ours: np.lib.npyio.NpzFile) -> float:
    """Max over every deadline (each point of either frontier) of E_ours / E_base − 1."""
    deadlines = np.union1d(base["time_s"], ours["time_s"])
    worst = -np.inf
    for t in deadlines:
        kb = np.searchsorted(base["time_s"], t * (1 + 1e-12), side="right") - 1
        ko = np.searchsorted(ours["time_s"], t * (1 + 1e-12), side="right") - 1
        if kb < 0 or ko < 0:
            continue  # faster than one frontier's fastest plan
        worst = max(worst, float(ours["energy_j"][ko] / base["energy_j"][kb] - 1))
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="9b7afbb")
    parser.add_argument(
        "--cases", default="1f1b:16x128,1f1b:16x256,zb:16x128", help="'': the small end only"
    )
    parser.add_argument("--small", default="8x24")
    parser.add_argument("--repeat-small", type=int, default=3)
    parser.add_argument("--no-base", action="store_true", help="time this tree only")
    parser.add_argument("--no-lowtime", action="store_true")
    args = parser.parse_args(argv)
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="bench_solver_scale_") as tmp_name:
        tmp = Path(tmp_name)
        trees = {"this": ROOT}
        if not args.no_base:
            subprocess.run(
                ["git", "worktree", "add", "--detach", "-q", str(tmp / "base"), args.base],
                cwd=ROOT,
                check=True,
            )
            trees["base"] = tmp / "base"
        for tree in trees.values():  # as pip leaves an installed package (and lowtime)
            subprocess.run(
                # `schedulers` sat beside `perseus` in trees before it moved inside.
                [py, "-m", "compileall", "-q", "perseus", "zeus_power"]
                + (["schedulers"] if (tree / "schedulers").is_dir() else []),
                cwd=tree,
                check=True,
                stdout=subprocess.DEVNULL,
            )
        try:
            profile = tmp / "h100_16.csv"
            run_child(
                [
                    py,
                    "-m",
                    "perseus",
                    "profile",
                    "synth",
                    "--gpu",
                    "H100-SXM",
                    "--stages",
                    "16",
                    "--work",
                    WORK,
                    "--out",
                    str(profile),
                ],
                ROOT,
            )
            print(
                "| case | base: solve wall (CPU), peak | this tree: solve wall (CPU), peak | speed-up | "
                "`perseus solve --no-plots` (this tree): wall (CPU), peak | LP breakpoints base / this | "
                "worst energy vs base over every deadline | gap above LP bound, max: base / this |"
            )
            print("|---|---|---|---|---|---|---|---|")
            for case in filter(None, args.cases.split(",")):
                name, size = case.split(":")
                S, M = (int(x) for x in size.split("x"))
                result: dict[str, tuple[Run, np.lib.npyio.NpzFile]] = {}
                for label, tree in trees.items():
                    out = tmp / f"{label}_{name}_{size}.npz"
                    run = run_child(
                        [py, "-c", DRIVER, str(profile), name, str(S), str(M), str(out)], tree
                    )
                    result[label] = (run, np.load(out))
                cli = [
                    py,
                    "-m",
                    "perseus",
                    "solve",
                    str(profile),
                    "-m",
                    str(M),
                    "--schedule",
                    name,
                    "--no-plots",
                    "--out",
                    str(tmp / "cli"),
                ]
                if name == "zb":
                    cli += ["--split-backward", "0.5"]
                cli_run = run_child(cli, ROOT)
                this_run, this = result["this"]
                gap_this = float((this["energy_j"] / this["bound_j"] - 1).max())
                if "base" in result:
                    base_run, base = result["base"]
                    gap_base = float((base["energy_j"] / base["bound_j"] - 1).max())
                    cells = (
                        f"{base_run.wall_s:.1f} s ({base_run.cpu_s:.1f} s), "
                        f"{base_run.peak_mb:.0f} MB",
                        f"{base_run.wall_s / this_run.wall_s:.1f}× "
                        f"({base_run.cpu_s / this_run.cpu_s:.1f}×)",
                        f"{int(base['breakpoints'])} / {int(this['breakpoints'])}",
                        f"{100 * worst_difference(base, this):+.3f} %",
                        f"{100 * gap_base:.2f} / {100 * gap_this:.2f} %",
                    )
                else:
                    cells = (
                        "—",
                        "—",
                        f"— / {int(this['breakpoints'])}",
                        "—",
                        f"— / {100 * gap_this:.2f} %",
                    )
                print(
                    f"| {name} {S}×{M} | {cells[0]} | {this_run.wall_s:.1f} s "
                    f"({this_run.cpu_s:.1f} s), {this_run.peak_mb:.0f} MB | **{cells[1]}** | "
                    f"**{cli_run.wall_s:.1f} s** ({cli_run.cpu_s:.1f} s), "
                    f"{cli_run.peak_mb:.0f} MB | {cells[2]} | {cells[3]} | {cells[4]} |",
                    flush=True,
                )
            if A40.is_file():
                S, M = (int(x) for x in args.small.split("x"))
                small = [py, "-m", "perseus", "solve", str(A40), "-m", str(M), "--stages", str(S)]
                small += ["--no-plots", "--out", str(tmp / "small")]
                best: dict[str, Run] = {}
                for label, tree in trees.items():
                    runs = [run_child(small, tree) for _ in range(args.repeat_small)]
                    best[label] = min(runs, key=lambda r: r.wall_s)
                ours = best["this"]
                line = (
                    f"`perseus solve --no-plots` GPT-3 A40 {S}×{M}: this tree "
                    f"{ours.wall_s:.2f} s ({ours.cpu_s:.2f} s)"
                )
                if "base" in best:
                    line += f", base {best['base'].wall_s:.2f} s ({best['base'].cpu_s:.2f} s)"
                if not args.no_lowtime:
                    lt = run_child(
                        [py, "-c", LOWTIME, str(ROOT / "benchmarks"), str(A40), str(S), str(M)],
                        ROOT,
                    )
                    line += (
                        f"; lowtime 0.3.0 {lt.wall_s:.1f} s ({lt.cpu_s:.1f} s): "
                        f"**{lt.wall_s / ours.wall_s:.0f}×** wall, {lt.cpu_s / ours.cpu_s:.0f}× CPU"
                    )
                    if "base" in best:
                        line += f" (base: {lt.wall_s / best['base'].wall_s:.0f}× wall)"
                print(line)
        finally:
            if "base" in trees:
                subprocess.run(
                    ["git", "worktree", "remove", "--force", str(trees["base"])],
                    cwd=ROOT,
                    check=False,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
