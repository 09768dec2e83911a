"""Benchmark: what the online profiling sweep costs before a plan is deployed, and what it buys.

Usage::

    python benchmarks/bench_profiling_cost.py [--profile PATH | --synth] [--size 8x48]
        [--sweeps full,full:early_stop_after=999,coarse] [--max-slowdown 0]

The online loop runs for real: the `Perseus` scheduler the coordinator builds for a job
(`perseus.schedulers.registry`, sweep → solve → deploy), driven round by round through its
coordinator interface (`next_schedule` / `observe`) by simulated ranks. The ranks replay a
ground-truth profile: an instruction run at f MHz takes the profile's time and energy at f,
a rank blocked or idle draws `P_BLOCK_W`, and the iteration time is the longest path of the
instruction DAG (synchronous 1F1B, S stages × M microbatches). The ground truth is the real
Bloom 176B A40 profile in ``../shared/data`` (8 stages, 60 clocks 1740..855 MHz, measured:
noisy near the top) or, with ``--synth``, the emulator's A40 model (`perseus.synth`, preset
"bloom", 8 stages, every A40 clock 1740..210 MHz).

Per sweep (`sweep` scheduler argument) it prints:

- rounds until deployed: the rounds run before the first one that runs the deployed plan
  (warm-up + sweep);
- the profiling rounds' time and energy (one pipeline's GPUs, blocking included) against
  the same number of rounds at all-max;
- the deployed plan's energy (the scheduler's prediction = the ground truth's here) against
  the cheapest plan with T ≤ the deployed plan's T solved from the complete ground-truth
  profile (every clock of every instruction): the gap the sweep's missing options cost; and
  against the complete profile's LP lower bound at that T (what no plan can beat);
- the plans the swept profile's frontier gives at deadlines 1, 2, 5 and 10 % above all-max
  (what `max_slowdown` or a straggler would pick) against the complete profile's.

Before: ``full`` (every clock, high → low, per-instruction early stop after 2 energy rises in
a row), the default until the coarse sweep; ``full:early_stop_after=999`` measures every
clock. After: ``coarse``, the default (`perseus.schedulers.sweep.instruction_sweep`). ``name:arg=value+arg=value``
passes more sweep arguments (e.g. ``coarse:refine=0``, ``coarse:coarse_step=6``).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_solver import DEFAULT_PROFILE

from perseus.domain.kinds import DEFAULT_P2P_POWER_W
from perseus.domain.profile import InstructionProfile
from perseus.domain.schedule import PipelineSchedule, make_schedule
from perseus.planning import Frontier, evaluate, max_frequencies, solve_frontier
from perseus.protocol import FrequencySchedule, JobInfo, PipelineSpec, ProfilingResult, RankInfo
from perseus.schedulers.base import build_scheduler
from perseus.schedulers.perseus_scheduler.scheduler import Perseus, PerseusPhase
from perseus.settings import PerseusSettings

P_BLOCK_W = DEFAULT_P2P_POWER_W
"""What a simulated GPU draws while blocked or idle (the A40's, as `bench_solver`)."""


class TablePipeline:
    """Simulated ranks of one pipeline that replay a ground-truth profile (no noise)."""

    def __init__(self, truth: InstructionProfile, schedule: PipelineSchedule) -> None:
        self.schedule = schedule
        self.table: dict[tuple[int, str, int], tuple[float, float]] = {}
        for stage, kind in truth:
            o = truth.options(stage, kind)
            for f, t, e in zip(o.freq_mhz, o.time_s, o.energy_j, strict=True):
                self.table[stage, kind, int(f)] = (float(t), float(e))
        self.frequencies = truth.frequencies()
        order = schedule.instructions()
        dag = schedule.dag()
        index = {ins: i for i, ins in enumerate(order)}
        self._order = order
        self._preds = [[index[p] for p in dag.predecessors(ins)] for ins in order]
        self._slot = {ins: (ins.rank, k) for r in schedule.orders for k, ins in enumerate(r)}

    def rank_infos(self) -> list[RankInfo]:
        return [
            RankInfo(
                rank=r,
                dp_rank=0,
                pp_rank=r,
                tp_rank=0,
                available_frequencies=list(self.frequencies),
            )
            for r in range(self.schedule.num_stages)
        ]

    def run(self, schedules: list[FrequencySchedule]) -> tuple[list[ProfilingResult], float, float]:
        """Every rank's result for one iteration, the iteration time and the pipeline's energy."""
        by_rank = {s.rank: s.frequencies for s in schedules}
        te: dict[tuple[int, int], tuple[float, float]] = {}
        for rank, order in enumerate(self.schedule.orders):
            entries = by_rank[rank]
            for k, (ins, (kind, f)) in enumerate(zip(order, entries, strict=True)):
                assert ins.kind == kind, "plan ≠ the rank's order"
                te[rank, k] = self.table[ins.stage, kind, f]
        finish = [0.0] * len(self._order)
        for i, ins in enumerate(self._order):
            start = max((finish[p] for p in self._preds[i]), default=0.0)
            finish[i] = start + te[self._slot[ins]][0]
        iter_time = max(finish)
        results = []
        total = 0.0
        for rank, order in enumerate(self.schedule.orders):
            tb: dict[str, list[float]] = {}
            eb: dict[str, list[float]] = {}
            for k, ins in enumerate(order):
                t, e = te[rank, k]
                tb.setdefault(ins.kind, []).append(t)
                eb.setdefault(ins.kind, []).append(e)
            busy = math.fsum(t for v in tb.values() for t in v)
            energy = math.fsum(e for v in eb.values() for e in v) + P_BLOCK_W * (iter_time - busy)
            total += energy
            results.append(
                ProfilingResult(
                    rank=rank,
                    iter_time=[iter_time],
                    iter_energy=[energy],
                    time_breakdown={k: [v] for k, v in tb.items()},
                    energy_breakdown={k: [v] for k, v in eb.items()},
                )
            )
        return results, iter_time, total


@dataclass
class Outcome:
    sweep: str
    rounds: int
    measured_options: int
    profiling_time_s: float
    profiling_energy_j: float
    deployed_time_s: float
    deployed_energy_j: float
    solve_s: float
    frontier: Frontier


SLOWDOWNS = (0.01, 0.02, 0.05, 0.1)
"""Deadlines (1 + s) × all-max T at which the two frontiers' choices are compared."""


def slowdown_gaps(reduced: Frontier, complete: Frontier, all_max_s: float) -> list[float]:
    """At each of `SLOWDOWNS`: the reduced profile's plan against the complete profile's."""
    out = []
    for s in SLOWDOWNS:
        deadline = (1 + s) * all_max_s
        out.append(
            reduced.choose(deadline_s=deadline).energy_j
            / complete.choose(deadline_s=deadline).energy_j
            - 1
        )
    return out


def run_online(
    pipeline: TablePipeline, sweep_args: dict[str, object], max_slowdown: float, dump: Path
) -> Outcome:
    """Drive the coordinator's `Perseus` scheduler until it deploys a plan."""
    schedule = pipeline.schedule
    info = JobInfo(
        pp_degree=schedule.num_stages,
        dp_degree=1,
        tp_degree=1,
        world_size=schedule.num_stages,
        pipeline=PipelineSpec.of(schedule),
    ).model_copy(update={"job_id": "bench"})
    args = {"max_slowdown": max_slowdown, **sweep_args}
    settings = PerseusSettings(scheduler="Perseus", scheduler_args=args, dump_dir=str(dump))
    scheduler = build_scheduler(Perseus, info, pipeline.rank_infos(), settings, args)
    assert isinstance(scheduler, Perseus)
    rounds = 0
    time_s = energy_j = 0.0
    t0 = time.perf_counter()
    while True:
        schedules = scheduler.next_schedule()
        if scheduler.phase is PerseusPhase.DEPLOYED:
            break
        results, t, e = pipeline.run(schedules)
        rounds += 1
        time_s += t
        energy_j += e
        scheduler.observe(results)
    solve_s = time.perf_counter() - t0
    chosen = scheduler.chosen
    assert chosen is not None and scheduler.profile is not None
    assert scheduler.frontier is not None
    measured = sum(len(scheduler.profile.options(s, k).freq_mhz) for s, k in scheduler.profile)
    return Outcome(
        sweep=str(sweep_args["sweep"]),
        rounds=rounds,
        measured_options=measured,
        profiling_time_s=time_s,
        profiling_energy_j=energy_j,
        deployed_time_s=chosen.iteration_time,
        deployed_energy_j=chosen.energy,
        solve_s=solve_s,
        frontier=scheduler.frontier,
    )


def parse_sweep(text: str) -> dict[str, object]:
    """``coarse`` or ``full:early_stop_after=99,...``: the sweep's scheduler arguments."""
    name, _, rest = text.partition(":")
    out: dict[str, object] = {"sweep": name}
    for item in filter(None, rest.split("+")):
        key, _, value = item.partition("=")
        out[key] = float(value) if "." in value else int(value)
    return out


def load_truth(args: argparse.Namespace, stages: int) -> InstructionProfile | None:
    if args.synth:
        from perseus.synth import synthesize_profile

        frame = synthesize_profile("A40", [1.0] * (stages - 1) + [0.8], preset="bloom")
        return InstructionProfile.from_frame(frame, source="synth A40 bloom")
    if not args.profile.is_file():
        return None
    frame = pd.read_csv(args.profile)[["stage", "instruction", "frequency", "time", "energy"]]
    return InstructionProfile.from_frame(frame, source=args.profile.name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--profile",
        type=Path,
        default=DEFAULT_PROFILE.with_name("sosp24_bloom-176b_a40_8stage.csv"),
    )
    parser.add_argument("--synth", action="store_true", help="the emulator's A40 model instead")
    parser.add_argument("--size", default="8x48", help="SxM (1f1b)")
    parser.add_argument(
        "--sweeps",
        default="full,full:early_stop_after=999,coarse",
        help="comma-separated sweeps: `sweep` value[:arg=value+arg=value...]",
    )
    parser.add_argument("--max-slowdown", type=float, default=0.0)
    args = parser.parse_args()
    S, M = (int(x) for x in args.size.lower().split("x"))
    truth = load_truth(args, S)
    if truth is None:
        print(f"skipped: no profile at {args.profile}")
        return 0
    if truth.num_stages != S:
        print(f"the ground truth has {truth.num_stages} stages; use --size {truth.num_stages}xM")
        return 2
    schedule = make_schedule("1f1b", S, M)
    pipeline = TablePipeline(truth, schedule)
    base = evaluate(truth, schedule, max_frequencies(truth, schedule), P_BLOCK_W)
    t0 = time.perf_counter()
    complete = solve_frontier(truth, schedule, p2p_power_w=P_BLOCK_W)
    complete_s = time.perf_counter() - t0
    options = sum(len(truth.options(s, k).freq_mhz) for s, k in truth)
    print(
        f"{truth.source}: {S}x{M} 1F1B, {len(truth.frequencies())} clocks "
        f"{truth.frequencies()[0]}..{truth.frequencies()[-1]} MHz, P_block {P_BLOCK_W} W; "
        f"all-max T {base.iteration_time_s:.3f} s, E {base.energy_j:.0f} J; complete profile "
        f"({options} options) solved in {complete_s:.1f} s"
    )
    print(
        "| sweep | rounds until deployed | options measured | profiling time vs all-max "
        "| profiling energy vs all-max | deployed T vs all-max | deployed E vs all-max "
        "| deployed E vs complete-profile plan at its T | … vs complete profile's LP bound "
        "| plan vs complete-profile plan at 1 / 2 / 5 / 10 % slowdown | online loop (s) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for sweep in args.sweeps.split(","):
        sweep_args = parse_sweep(sweep)
        with tempfile.TemporaryDirectory() as tmp:
            out = run_online(pipeline, sweep_args, args.max_slowdown, Path(tmp))
        ref = complete.choose(deadline_s=out.deployed_time_s)
        assert complete.lp_curve is not None
        bound = float(complete.lp_curve.lower_bound(out.deployed_time_s))
        gaps = " / ".join(
            f"{g:+.2%}" for g in slowdown_gaps(out.frontier, complete, base.iteration_time_s)
        )
        n = out.rounds
        extra_t = out.profiling_time_s - n * base.iteration_time_s
        extra_e = out.profiling_energy_j - n * base.energy_j
        print(
            f"| {sweep} | {n} | {out.measured_options} of {options} "
            f"| {out.profiling_time_s:.1f} s ({extra_t:+.1f} s, "
            f"{out.profiling_time_s / (n * base.iteration_time_s) - 1:+.2%}) "
            f"| {out.profiling_energy_j / 1000:.1f} kJ ({extra_e / 1000:+.2f} kJ, "
            f"{out.profiling_energy_j / (n * base.energy_j) - 1:+.2%}) "
            f"| {out.deployed_time_s / base.iteration_time_s - 1:+.3%} "
            f"| {out.deployed_energy_j / base.energy_j - 1:+.2%} "
            f"| {out.deployed_energy_j / ref.energy_j - 1:+.3%} "
            f"| {out.deployed_energy_j / bound - 1:+.3%} "
            f"| {gaps} | {out.solve_s:.1f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
