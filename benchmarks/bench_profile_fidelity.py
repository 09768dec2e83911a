"""Benchmark: how true the online profile is, over a seeded family of jobs nobody tuned for.

Usage::

    python benchmarks/bench_profile_fidelity.py [--jobs 60] [--seed 0] [--max-ranks 16]
        [--max-slowdown 0.01] [--guard-rounds 8] [--switch-latency] [--json out.json]
        [--quiet]

Every job of the family (`fidelity_family.py`: 2–16 ranks; 1F1B, interleaved and zero
bubble; stages unbalanced up to 3×; instructions of 1–100 ms; curves drawn around the
published A40 profiles; 1–3 % timing jitter, power decaying after work stops, slow drift;
with ``--switch-latency``, clock changes that land 10–20 ms after they are asked for;
sensors refreshing every 100 ms and sampling the last 25 % of each period) runs through the
real online loop in virtual time: the coordinator's `Perseus` scheduler (its all-max
rounds, sweep, energy-window estimator, checks, planner and guard), driven round by round
through `next_schedule` / `observe` by the simulated ranks of `sensor_ranks.py`, which
report exactly what a rank reports. The truth (each (stage, kind, clock)'s time and power)
is known here and nowhere in the loop.

Per job, and over the family:

- energy and time error of every row of the profile against the truth (median, p95, max);
- coverage: the share of rows whose truth lies within 2 of their stated standard errors;
- plan regret at budgets 0, 1 % and 5 %: the plan chosen from the job's profile (the same
  frontier solver, at ``(1 + budget) ×`` the profile's all-max time), scored on the truth,
  against the truth's own best plan at ``(1 + budget) ×`` the truth's all-max time; and by
  how much the chosen plan overruns that deadline on the truth;
- the deployed plan's saving as predicted against the same plan's saving on the truth
  (points), and what the guard then did;
- profiling time in iterations and rounds, and rows the estimator left out.

A job whose checks keep all-max deploys nothing: its regret figures still come from its
profile, its saving gap is not counted.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from fidelity_family import CLOCKS, GPU_TYPE, IDLE_W, LIMIT_W, SENSORS, JobShape, family
from sensor_ranks import Ranks  # this script's folder is on sys.path

from perseus.domain.profile import InstructionProfile
from perseus.errors import ProfileError
from perseus.planning import evaluate, max_frequencies, solve_frontier
from perseus.protocol import FrequencySchedule
from perseus.schedulers.base import build_scheduler
from perseus.schedulers.perseus_scheduler.scheduler import Perseus, PerseusPhase
from perseus.settings import PerseusSettings
from zeus_power.device.sensors import sensor_spec

BUDGETS = (0.0, 0.01, 0.05)
DRAWN_STEPS = 20
"""Steps each of all-max and the deployed plan run for its saving as the GPUs draw it."""
MAX_ROUNDS = 400
"""A job still profiling after this many rounds counts as failed (none comes near)."""


@dataclass
class JobResult:
    name: str
    rows: int = 0
    left_out: int = 0
    unphysical: int = 0
    """Rows of the profile whose power (energy over time) is above the limit or below idle."""
    energy_err: list[float] = field(default_factory=list)
    time_err: list[float] = field(default_factory=list)
    covered: list[bool] = field(default_factory=list)
    regret: dict[str, float] = field(default_factory=dict)
    """Against the truth's best plan over the clocks the profile holds."""
    regret_all: dict[str, float] = field(default_factory=dict)
    """Against the truth's best plan over every clock (the sweep's skipped clocks count)."""
    overrun: dict[str, float] = field(default_factory=dict)
    rounds: int = 0
    iterations: int = 0
    deployed: bool = False
    held: str | None = None
    predicted_saving: float | None = None
    truth_saving: float | None = None
    """The deployed plan's saving as the job's GPUs draw it (`_drawn_saving`)."""
    model_saving: float | None = None
    """The same plan's saving on the truth's static figures (each instruction's time and
    power, idle power whenever no instruction runs): no power after work stops."""
    guard_phase: str | None = None
    worst_row: dict[str, Any] | None = None
    """The row of the largest energy error: its key, estimate, stated error and truth."""
    wall_s: float = 0.0
    failed: str | None = None

    def summary(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("energy_err", "time_err", "covered"):
            d.pop(key)
        return d


def _saving(profile: InstructionProfile, job: JobShape, freqs: list[list[int]], p2p: float):
    schedule = job.schedule()
    base = evaluate(profile, schedule, max_frequencies(profile, schedule), p2p)
    mine = evaluate(profile, schedule, freqs, p2p)
    return 1 - mine.energy_j / base.energy_j, mine.iteration_time_s / base.iteration_time_s - 1


def _drawn_saving(
    job: JobShape, args: argparse.Namespace, schedules: list[FrequencySchedule]
) -> float:
    """The saving of `schedules` (the deployed plan's round) against all-max as GPUs like
    the job's draw it (power after work stops, drift, the job's clock switches; no timing
    jitter): each run for `DRAWN_STEPS` steps after a round of its own to settle, and
    the energy the GPUs drew, exactly (`EmulatedGPU.drawn_energy_j`), compared."""
    ranks = Ranks(
        job.schedule(),
        job.truth,
        sensor_spec("ideal"),
        seed=job.index,
        gpu_type=GPU_TYPE,
        frequencies=CLOCKS,
        gpu_options=_disturbances(job, args),
        switch_latency_s=job.switch_latency_s if args.switch_latency else 0.0,
    )
    top = max(CLOCKS)
    all_max = [
        s.model_copy(update={"frequencies": [(k, top) for k, _ in s.frequencies]})
        for s in schedules
    ]
    energy = []
    for round_ in (all_max, schedules):
        steps = [
            s.model_copy(update={"steps": DRAWN_STEPS, "replica_frequencies": {}}) for s in round_
        ]
        ranks.run(steps)  # the clock change and the last round's tails settle
        ranks.run(steps)
        energy.append(ranks.last_drawn_j)
    return 1 - energy[1] / energy[0]


def run_job(job: JobShape, args: argparse.Namespace) -> JobResult:
    t0 = time.perf_counter()
    result = JobResult(job.name)
    schedule = job.schedule()
    ranks = Ranks(
        schedule,
        job.truth,
        SENSORS,
        seed=job.index,
        gpu_type=GPU_TYPE,
        frequencies=CLOCKS,
        jitter=job.jitter,
        gpu_options=_disturbances(job, args),
        switch_latency_s=job.switch_latency_s if args.switch_latency else 0.0,
    )
    sched_args: dict[str, object] = {"max_slowdown": args.max_slowdown}
    with tempfile.TemporaryDirectory() as tmp:
        settings = PerseusSettings(scheduler="Perseus", scheduler_args=sched_args, dump_dir=tmp)
        info = ranks.job_info(f"fidelity-{job.index}")
        scheduler = build_scheduler(Perseus, info, ranks.rank_infos(), settings, sched_args)
        assert isinstance(scheduler, Perseus)
        guard_left = args.guard_rounds
        deployed = None
        deployed_round: list[FrequencySchedule] = []
        for _ in range(MAX_ROUNDS):
            try:
                schedules = scheduler.next_schedule()
            except ProfileError as exc:
                result.failed = str(exc)
                break
            except Exception as exc:  # the job would fail: count it, go on with the family
                result.failed = f"{type(exc).__name__}: {str(exc)[:160]}"
                break
            if deployed is None and scheduler.phase is PerseusPhase.DEPLOYED:
                deployed = scheduler.chosen
                deployed_round = schedules
                result.predicted_saving, _ = scheduler._predicted(deployed)
            if scheduler.phase is not PerseusPhase.PROFILING:
                if scheduler.phase is PerseusPhase.DEPLOYED and guard_left > 0:
                    guard_left -= 1
                else:
                    break
            results, _ = ranks.run(schedules)
            try:
                scheduler.observe(results)
            except Exception as exc:  # the job would fail: count it, go on with the family
                result.failed = f"{type(exc).__name__}: {str(exc)[:160]}"
                break
        else:
            result.failed = f"still profiling after {MAX_ROUNDS} rounds"
        report_path = scheduler.job_dir.profiling
        report = json.loads(report_path.read_text()) if report_path.exists() else {}
    result.rounds = int(report.get("rounds") or 0)
    result.iterations = int(report.get("iterations") or 0)
    result.guard_phase = scheduler.phase.value
    profile = scheduler.profile
    if profile is None or result.failed:
        result.failed = result.failed or "no profile"
        result.wall_s = time.perf_counter() - t0
        return result
    keys = set()
    for stage, kind in profile:
        o = profile.options(stage, kind)
        for f, t, e in zip(o.freq_mhz, o.time_s, o.energy_j, strict=True):
            keys.add((stage, kind, int(f)))
            t_true, p_true = job.truth(stage, kind, int(f))
            e_true = p_true * t_true
            result.energy_err.append(abs(e / e_true - 1))
            if result.energy_err[-1] >= max(result.energy_err):
                result.worst_row = {
                    "stage": stage,
                    "kind": str(kind),
                    "mhz": int(f),
                    "energy_j": e,
                    "energy_se_j": profile.energy_se.get((stage, kind, int(f)), 0.0),
                    "true_energy_j": e_true,
                    "time_s": t,
                    "true_time_s": t_true,
                }
            result.unphysical += not (IDLE_W <= e / t <= LIMIT_W * (1 + 1e-9))
            result.time_err.append(abs(t / t_true - 1))
            s = profile.energy_se.get((stage, kind, int(f)), 0.0)
            result.covered.append(abs(e - e_true) <= 2 * s)
    result.rows = len(result.energy_err)
    result.left_out = sum(1 for e in report.get("left_out") or [] if not e.get("max_clock"))
    p2p_est = scheduler.p2p_power_w
    est_frontier = solve_frontier(profile, schedule, p2p_power_w=p2p_est)
    truth = ranks.truth_profile({(s, k, f) for s, k in job.curves for f in CLOCKS})
    same = ranks.truth_profile(keys)
    true_frontier = solve_frontier(same, schedule, p2p_power_w=IDLE_W)
    every_clock = solve_frontier(truth, schedule, p2p_power_w=IDLE_W)
    true_max = evaluate(truth, schedule, max_frequencies(truth, schedule), IDLE_W)
    for b in BUDGETS:
        mine = est_frontier.choose(max_slowdown=b)
        scored = evaluate(truth, schedule, mine.frequencies, IDLE_W)
        deadline = true_max.iteration_time_s * (1 + b)
        best = true_frontier.choose(deadline_s=deadline)
        result.regret[f"{b:g}"] = scored.energy_j / best.energy_j - 1
        result.regret_all[f"{b:g}"] = (
            scored.energy_j / every_clock.choose(deadline_s=deadline).energy_j - 1
        )
        result.overrun[f"{b:g}"] = scored.iteration_time_s / deadline - 1
    result.deployed = deployed is not None
    held = [e for e in scheduler.promise_events() if e.get("event") == "held"]
    if held:
        result.held = str(held[0].get("reason") or held[0])[:200]
    fell = [e for e in scheduler.promise_events() if e.get("event") == "fallback"]
    if fell:
        result.guard_phase = f"fallback: {str(fell[0].get('reason'))[:120]}"
    if deployed is not None:
        result.model_saving, _ = _saving(truth, job, deployed.stage_frequencies(), IDLE_W)
        result.truth_saving = _drawn_saving(job, args, deployed_round)
    result.wall_s = time.perf_counter() - t0
    return result


def _disturbances(job: JobShape, args: argparse.Namespace) -> dict[str, float]:
    if args.no_disturbances:
        return {}
    return {"power_decay_s": job.decay_s, "power_drift_per_hour": job.drift_per_hour}


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else math.nan


def table(results: list[JobResult]) -> dict[str, Any]:
    """The family's figures."""
    ok = [r for r in results if not r.failed]
    e = [x for r in ok for x in r.energy_err]
    t = [x for r in ok for x in r.time_err]
    cov = [x for r in ok for x in r.covered]
    out: dict[str, Any] = {
        "jobs": len(results),
        "failed": len(results) - len(ok),
        "rows": len(e),
        "left_out": sum(r.left_out for r in ok),
        "unphysical": sum(r.unphysical for r in ok),
        "energy_err": {"median": _pct(e, 50), "p95": _pct(e, 95), "max": max(e, default=math.nan)},
        "time_err": {"median": _pct(t, 50), "p95": _pct(t, 95), "max": max(t, default=math.nan)},
        "coverage": float(np.mean(cov)) if cov else math.nan,
        "regret": {},
        "regret_all": {},
        "overrun": {},
    }
    for b in BUDGETS:
        key = f"{b:g}"
        reg = [r.regret[key] for r in ok if key in r.regret]
        every = [r.regret_all[key] for r in ok if key in r.regret_all]
        over = [r.overrun[key] for r in ok if key in r.overrun]
        out["regret"][key] = {"median": _pct(reg, 50), "p95": _pct(reg, 95), "max": max(reg)}
        out["regret_all"][key] = {
            "median": _pct(every, 50),
            "p95": _pct(every, 95),
            "max": max(every),
        }
        out["overrun"][key] = {"median": _pct(over, 50), "p95": _pct(over, 95), "max": max(over)}
    gaps = [
        r.predicted_saving - r.truth_saving
        for r in ok
        if r.predicted_saving is not None and r.truth_saving is not None
    ]
    out["deployed"] = sum(1 for r in ok if r.predicted_saving is not None)
    out["held"] = sum(1 for r in ok if r.held)
    out["saving_gap_points"] = {
        "median": _pct([abs(g) for g in gaps], 50) * 100,
        "p95": _pct([abs(g) for g in gaps], 95) * 100,
        "max": max((abs(g) for g in gaps), default=math.nan) * 100,
        "mean_signed": float(np.mean(gaps)) * 100 if gaps else math.nan,
    }
    model_gaps = [
        abs(r.predicted_saving - r.model_saving)
        for r in ok
        if r.predicted_saving is not None and r.model_saving is not None
    ]
    out["model_saving_gap_points"] = {
        "median": _pct(model_gaps, 50) * 100,
        "p95": _pct(model_gaps, 95) * 100,
        "max": max(model_gaps, default=math.nan) * 100,
    }
    out["iterations"] = {
        "median": _pct([r.iterations for r in ok], 50),
        "max": max((r.iterations for r in ok), default=0),
    }
    return out


def print_table(fig: dict[str, Any]) -> None:
    e, t, r = fig["energy_err"], fig["time_err"], fig["regret"]
    print(
        f"jobs {fig['jobs']} (failed {fig['failed']}), rows {fig['rows']} "
        f"(left out {fig['left_out']}; a power above the limit or below idle: "
        f"{fig['unphysical']})"
    )
    print("| figure | median | p95 | max |")
    print("|---|---|---|---|")
    print(f"| energy error per row | {e['median']:.2%} | {e['p95']:.2%} | {e['max']:.2%} |")
    print(f"| time error per row | {t['median']:.2%} | {t['p95']:.2%} | {t['max']:.2%} |")
    for b, v in r.items():
        o, a = fig["overrun"][b], fig["regret_all"][b]
        print(
            f"| plan regret at budget {float(b):.0%} (its deadline overrun; vs every clock) "
            f"| {v['median']:+.2%} ({o['median']:+.2%}; {a['median']:+.2%}) "
            f"| {v['p95']:+.2%} ({o['p95']:+.2%}; {a['p95']:+.2%}) "
            f"| {v['max']:+.2%} ({o['max']:+.2%}; {a['max']:+.2%}) |"
        )
    g, m = fig["saving_gap_points"], fig["model_saving_gap_points"]
    print(
        f"| deployed plan: predicted − true saving as drawn, points ({fig['deployed']} "
        f"deployed, {fig['held']} held; mean signed {g['mean_signed']:+.2f}) "
        f"| {g['median']:.2f} | {g['p95']:.2f} | {g['max']:.2f} |"
    )
    print(
        f"| the same against the truth's static figures (idle when no instruction runs) "
        f"| {m['median']:.2f} | {m['p95']:.2f} | {m['max']:.2f} |"
    )
    print(
        f"| profiling, iterations | {fig['iterations']['median']:.0f} | | "
        f"{fig['iterations']['max']} |"
    )
    print(f"coverage (truth within 2 stated standard errors): {fig['coverage']:.1%}")


def run_family(args: argparse.Namespace) -> tuple[list[JobResult], dict[str, Any]]:
    results = []
    for job in family(args.seed, args.jobs, max_ranks=args.max_ranks, start=args.start):
        r = run_job(job, args)
        results.append(r)
        if not args.quiet:
            e = _pct(r.energy_err, 50), _pct(r.energy_err, 95)
            print(
                f"{r.name}: rows {r.rows}, energy error {e[0]:.2%} / {e[1]:.2%}, "
                f"regret@1% {r.regret.get('0.01', math.nan):+.2%}, saving predicted "
                f"{r.predicted_saving if r.predicted_saving is not None else math.nan:.2%} true "
                f"{r.truth_saving if r.truth_saving is not None else math.nan:.2%} (static "
                f"{r.model_saving if r.model_saving is not None else math.nan:.2%}), "
                f"{r.iterations} it, {r.wall_s:.1f} s{' FAILED ' + r.failed if r.failed else ''}"
                f"{' held: ' + r.held if r.held else ''}",
                flush=True,
            )
    return results, table(results)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start", type=int, default=0, help="the family's first job to run")
    p.add_argument("--max-ranks", type=int, default=16)
    p.add_argument("--max-slowdown", type=float, default=0.01)
    p.add_argument("--guard-rounds", type=int, default=8)
    p.add_argument("--no-disturbances", action="store_true", help="no decay, no drift")
    p.add_argument(
        "--switch-latency",
        action="store_true",
        help="clock changes land 10-20 ms after they are asked for (drawn per job); the "
        "short-instruction jobs then take many minutes each in virtual time",
    )
    p.add_argument("--json", type=str)
    p.add_argument("--quiet", action="store_true")
    return p


def main() -> int:
    args = parser().parse_args()
    t0 = time.perf_counter()
    results, fig = run_family(args)
    print(
        f"\nfamily seed {args.seed}, {args.jobs} jobs, ranks 2-{args.max_ranks}, "
        f"budget {args.max_slowdown:.0%}; {time.perf_counter() - t0:.0f} s"
    )
    print_table(fig)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"figures": fig, "jobs": [r.summary() for r in results]}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
