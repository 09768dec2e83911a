"""Benchmark: the Zeus batch-size + power-limit policy against the hindsight oracle.

Replays recurrences of a training job with `zeus_power.simulate` on tables made by the
emulated GPUs' DVFS model (see `make_emulator_tables`), and compares the policy's total
cost (every trial, exploration and failures included) with the best fixed
(batch size, power limit) known in hindsight, and with the default batch size at the max
power limit (no optimisation).

    python benchmarks/bench_zeus_policy.py [--recurrences 50 100] [--seeds 5] [--json out.json]

Exits 1 unless the policy's total cost is within 10 % of the oracle's for every scenario
and seed at the largest number of recurrences.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from zeus_power.simulate import make_emulator_tables, simulate

SCENARIOS = [
    # (name, gpu type, eta, default batch size)
    ("A40  eta=0.5 default=512", "A40", 0.5, 512),
    ("A40  eta=1.0 default=512", "A40", 1.0, 512),
    ("A40  eta=0.5 default=256", "A40", 0.5, 256),
    ("A100 eta=0.5 default=512", "A100-SXM", 0.5, 512),
    ("A100 eta=0.8 default=128", "A100-SXM", 0.8, 128),
]
TOLERANCE = 0.10


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recurrences", type=int, nargs="+", default=[50, 100])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    if min(args.recurrences) < 1 or args.seeds < 1:
        parser.error("--recurrences and --seeds must be positive")

    rows = []
    start = time.perf_counter()
    header = f"{'scenario':28} {'recs':>5} {'policy/oracle mean':>19} {'max':>7} {'default/oracle':>15} {'oracle (bs, W)':>15}"
    print(header)
    print("-" * len(header))
    for name, gpu_type, eta, default_bs in SCENARIOS:
        tables = make_emulator_tables(gpu_type=gpu_type, default_batch_size=default_bs)
        for recurrences in sorted(args.recurrences):
            ratios, defaults, oracles = [], [], set()
            for seed in range(args.seeds):
                result = simulate(tables, num_recurrences=recurrences, eta_knob=eta, seed=seed)
                ratios.append(result.ratio_to_oracle)
                if result.default_cost is not None:
                    defaults.append(result.default_cost / result.oracle.total_cost)
                oracles.add((result.oracle.batch_size, result.oracle.power_limit_w))
            row = {
                "scenario": name,
                "recurrences": recurrences,
                "seeds": args.seeds,
                "ratio_mean": statistics.fmean(ratios),
                "ratio_max": max(ratios),
                "default_ratio_mean": statistics.fmean(defaults) if defaults else None,
                "oracle_choices": sorted(oracles),
            }
            rows.append(row)
            default = f"{row['default_ratio_mean']:.3f}" if defaults else "fails"
            print(
                f"{name:28} {recurrences:>5} {row['ratio_mean']:>19.3f} {row['ratio_max']:>7.3f} "
                f"{default:>15} {', '.join(f'{b}/{p}' for b, p in sorted(oracles)):>15}"
            )
    elapsed = time.perf_counter() - start
    print(f"\n{len(rows) * args.seeds} simulations in {elapsed:.1f} s")

    gate = max(args.recurrences)
    worst = max(r["ratio_max"] for r in rows if r["recurrences"] == gate)
    ok = worst <= 1 + TOLERANCE
    print(
        f"Gate: at {gate} recurrences the worst policy/oracle ratio is {worst:.3f} "
        f"({'within' if ok else 'OUTSIDE'} {TOLERANCE:.0%})."
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"rows": rows, "gate_recurrences": gate, "worst": worst, "ok": ok}, f, indent=2
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
