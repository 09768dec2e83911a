"""Benchmark: plans with and without the switching model, deployed on emulated GPUs that
take time to switch clocks.

Usage::

    python benchmarks/bench_switching.py [--latency-ms 15] [--stages 4] [--microbatches 8]
                                         [--forward-ms 8] [--budgets 0,0.05]

An A40 pipeline (1F1B, S stages of unequal work, forwards of ``--forward-ms`` at the max
clock, backwards twice that: the 5–50 ms instructions of real pipelines) is profiled from
the emulator's own DVFS model (`perseus.synth`), so the only thing the planner does not
know is the switching latency. For every slowdown budget it picks a plan from two
frontiers: today's (clock changes free) and the switching model's
(``solve_frontier(switch_latency_s=L)``), and deploys each on one emulated GPU per rank
(`zeus_power.device.EmulatedGPU` with ``switch_latency_s=L``, in virtual time): every
instruction starts as soon as its DAG predecessors are done, the rank asks its GPU for the
instruction's clock when it starts (never the clock already asked for), and the GPU runs
the instruction with its own switching lag. Waits are booked at the blocking (P2P) power.
The all-max plan, deployed the same way, is the baseline of every saving and slowdown.

Measured = the emulated GPUs' energy counters and clocks over the second of two
iterations (the first starts from unlocked clocks); predicted = the plan's own numbers.
The emulator implements the lag independently of the planner (a pending clock with a
time of effect, `EmulatedGPU._run_switching`), so agreement is a check, not a tautology.
"""

from __future__ import annotations

import argparse
import math
import time

from perseus.domain.plan import clock_changes
from perseus.domain.profile import InstructionProfile
from perseus.domain.schedule import PipelineSchedule, make_schedule
from perseus.planning import Frontier, evaluate, max_frequencies, solve_frontier
from perseus.synth import stage_workloads, synthesize_profile
from zeus_power.device import EmulatedGPU, VirtualClock, Workload

GPU = "A40"
WORK = [1.0, 1.35, 1.1, 1.25, 1.0, 1.3, 1.15, 1.2]


def deploy(
    schedule: PipelineSchedule,
    workloads: list[tuple[Workload, Workload]],
    frequencies: list[list[int]],
    latency_s: float,
    *,
    iterations: int = 2,
) -> tuple[float, float]:
    """(iteration time, energy) of the last of `iterations` runs of the plan on emulated
    GPUs with `latency_s` switching latency (one per rank, virtual time)."""
    clocks = [VirtualClock() for _ in schedule.orders]
    gpus = [
        # Ideal sensors: one iteration's energy against the plan's, to the mJ.
        EmulatedGPU(r, gpu_type=GPU, clock=c, switch_latency_s=latency_s, sensors="ideal")
        for r, c in enumerate(clocks)
    ]
    p2p_w = gpus[0].p2p_block_power_w
    instructions = schedule.instructions()
    dag = schedule.dag()
    position = {ins: k for order in schedule.orders for k, ins in enumerate(order)}
    begin = 0.0
    result = (math.nan, math.nan)
    for _ in range(iterations):
        start_mj = [g.total_energy_mj() for g in gpus]
        finish: dict[object, float] = {}
        for ins in instructions:  # topological order
            s = max((finish[p] for p in dag.predecessors(ins)), default=begin)
            r = ins.rank
            gap = s - clocks[r]()
            if gap > 0:
                clocks[r].advance(gap)
                gpus[r].record_busy(gap, p2p_w)  # blocked on P2P
            f = frequencies[r][position[ins]]
            if f != gpus[r].target_sm_clock_mhz():
                gpus[r].lock_sm_clocks(f, f)
            fwd, bwd = workloads[ins.stage]
            run = gpus[r].execute(fwd if ins.kind == "forward" else bwd)
            finish[ins] = s + run.time_s
        end = max(finish.values())
        for r, c in enumerate(clocks):  # wait for the iteration's last rank
            if end > c():
                gpus[r].record_busy(end - c(), p2p_w)
                c.advance(end - c())
        energy_j = sum(g.total_energy_mj() - e0 for g, e0 in zip(gpus, start_mj, strict=True))
        result = (end - begin, energy_j / 1e3)
        begin = end
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--latency-ms", type=float, default=15.0)
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--forward-ms", type=float, default=8.0)
    ap.add_argument("--budgets", default="0,0.05")
    args = ap.parse_args()
    latency_s = args.latency_ms / 1000
    workloads = stage_workloads(GPU, WORK[: args.stages], base_forward_ms=args.forward_ms)
    frame = synthesize_profile(GPU, workloads, min_freq_mhz=900)
    frame["emulated"] = True
    profile = InstructionProfile.from_frame(frame, source="synth-A40")
    schedule = make_schedule("1f1b", args.stages, args.microbatches)
    p2p_w = EmulatedGPU(gpu_type=GPU).p2p_block_power_w
    t0 = time.perf_counter()
    frontiers: dict[str, Frontier] = {
        "free changes (today)": solve_frontier(profile, schedule, p2p_power_w=p2p_w),
        f"switching model, L={args.latency_ms:g} ms": solve_frontier(
            profile, schedule, p2p_power_w=p2p_w, switch_latency_s=latency_s
        ),
    }
    solve_s = time.perf_counter() - t0
    base_f = max_frequencies(profile, schedule)
    base_pred = evaluate(profile, schedule, base_f, p2p_w)
    base_t, base_e = deploy(schedule, workloads, base_f, latency_s)
    print(
        f"A40, 1F1B S={args.stages} M={args.microbatches}, forward {args.forward_ms:g} ms at "
        f"max clock, switching latency {args.latency_ms:g} ms; solved both frontiers in "
        f"{solve_s:.1f} s"
    )
    print(
        f"all-max: predicted T={base_pred.iteration_time_s * 1e3:.1f} ms "
        f"E={base_pred.energy_j:.2f} J; measured T={base_t * 1e3:.1f} ms E={base_e:.2f} J\n"
    )
    print(
        "| budget | planner | clock changes/iter | saving predicted | saving measured "
        "| slowdown predicted | slowdown measured | within budget |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for budget in (float(b) for b in args.budgets.split(",")):
        for name, frontier in frontiers.items():
            point = frontier.choose(max_slowdown=budget)
            t, e = deploy(schedule, workloads, point.frequencies, latency_s)
            ref_t = frontier.reference_time_s
            ref_e = frontier.all_max.energy_j if frontier.all_max is not None else base_pred.energy_j
            pred_save = 1 - point.energy_j / ref_e
            pred_slow = point.iteration_time_s / ref_t - 1
            meas_save = 1 - e / base_e
            meas_slow = t / base_t - 1
            ok = "yes" if meas_slow <= budget + 1e-9 else "NO"
            print(
                f"| {budget:.0%} | {name} | {clock_changes(point.frequencies)} "
                f"| {pred_save:.2%} | {meas_save:.2%} | {pred_slow:+.2%} | {meas_slow:+.2%} "
                f"| {ok} |"
            )


if __name__ == "__main__":
    main()
