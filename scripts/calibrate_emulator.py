"""Fit the emulator's A40 curve to the measured A40 profiles and print how well it fits.

    python scripts/calibrate_emulator.py [--data ../shared/data] [--stages 0,7] [--kinds]

Two passes over the SOSP'24 GPT-3 175B and Bloom 176B A40 profiles (8 stages,
1740→855 MHz, default 300 W power limit):

1. `fit_power_curve` fits the A40's curve (static power, voltage floor, knee, voltage
   exponent) jointly with every instruction's workload; these are the figures to copy
   into `zeus_power/device/specs.py`.
2. With the curve shipped in `specs.py`, `fit_workload` fits each instruction alone, and
   `compare` reports time/energy errors over all rows and where the energy-optimal clock
   lands (measured vs model, and the energy regret of using the model's choice).

``--kinds`` prints only the per-kind medians of the second pass (memory fraction and
activity of every profile's forwards and backwards): the emulator's per-kind presets,
`perseus.client.settings.KIND_PRESETS`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from zeus_power.device.calibration import MeasuredSweep, compare, fit_power_curve, fit_workload
from zeus_power.device.emulated import DVFSModel
from zeus_power.device.specs import get_gpu_spec

FILES = {
    "gpt3-175b": "sosp24_gpt3-175b_a40_8stage.csv",
    "bloom-176b": "sosp24_bloom-176b_a40_8stage.csv",
}
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def load(data: Path, stages: set[int] | None) -> list[tuple[str, int, str, MeasuredSweep]]:
    out = []
    for model, name in FILES.items():
        frame = pd.read_csv(data / name)
        for (stage, instruction), group in frame.groupby(["stage", "instruction"], sort=True):
            if stages is not None and stage not in stages:
                continue
            out.append(
                (
                    model,
                    int(stage),
                    str(instruction),
                    MeasuredSweep(
                        group["frequency"].to_numpy(),
                        group["time"].to_numpy(),
                        group["energy"].to_numpy(),
                    ),
                )
            )
    return out


def kind_medians(rows: list[tuple[str, int, str, MeasuredSweep]], model: DVFSModel) -> str:
    """Per profile and kind, the median memory fraction and activity of its stages' fits."""
    fits: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for name, _, instruction, m in rows:
        w = fit_workload(model, m)
        fits.setdefault((name, instruction), []).append((w.memory_fraction, w.activity))
    lines = ["profile     kind      memory fraction  activity  (median over stages)"]
    for (name, kind), values in sorted(fits.items()):
        mf, act = np.median(np.array(values), axis=0)
        lines.append(f"{name:11s} {kind:9s} {mf:15.3f} {act:9.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder of the CSVs")
    parser.add_argument("--stages", default=None, help="comma-separated stages (default: all)")
    parser.add_argument(
        "--kinds", action="store_true", help="only the per-kind medians (the emulator's presets)"
    )
    args = parser.parse_args(argv)
    if not all((args.data / f).is_file() for f in FILES.values()):
        print(f"Reference profiles not found in {args.data}", file=sys.stderr)
        return 2
    stages = None if args.stages is None else {int(s) for s in args.stages.split(",")}
    rows = load(args.data, stages)
    shipped = get_gpu_spec("A40")
    if args.kinds:
        print(kind_medians(rows, DVFSModel(shipped)))
        return 0

    started = time.perf_counter()
    fitted, _ = fit_power_curve(shipped, [m for *_, m in rows])
    print(f"Joint curve fit over {len(rows)} instructions ({time.perf_counter() - started:.1f} s):")
    for field in (
        "static_power_w",
        "dynamic_power_w",
        "voltage_floor",
        "knee_mhz",
        "voltage_exponent",
    ):
        print(
            f"  {field:17s} fitted {getattr(fitted, field):9.3f}   shipped {getattr(shipped, field):9.3f}"
        )

    model = DVFSModel(shipped)
    print("\nPer-instruction fit on the shipped A40 curve:")
    header = (
        f"{'model':11s} {'stage':>5s} {'instr':8s} {'compute_s':>9s} {'memory_s':>8s} {'activity':>8s}"
        f" {'f_cap':>5s} {'t_med%':>6s} {'t_max%':>6s} {'e_med%':>6s} {'e_max%':>6s}"
        f" {'f*_meas':>7s} {'f*_model':>8s} {'regret%':>7s}"
    )
    print(header)
    time_errs: list[np.ndarray] = []
    energy_errs: list[np.ndarray] = []
    regrets, offsets = [], []
    for name, stage, instruction, m in rows:
        w = fit_workload(model, m)
        q = compare(model, w, m)
        sweep = model.sweep(w, m.freq_mhz, shipped.default_power_limit_w)
        time_errs.append(np.abs(sweep.time_s / m.time_s - 1))
        energy_errs.append(np.abs(sweep.energy_j / m.energy_j - 1))
        regrets.append(q.optimum_regret)
        offsets.append(q.model_optimal_freq_mhz - q.measured_optimal_freq_mhz)
        print(
            f"{name:11s} {stage:5d} {instruction:8s} {w.compute_s_at_max:9.4f} {w.memory_s:8.4f}"
            f" {w.activity:8.3f} {model.effective_freq_mhz(w, None, 300):5d}"
            f" {100 * q.time_rel_err_median:6.2f} {100 * q.time_rel_err_max:6.2f}"
            f" {100 * q.energy_rel_err_median:6.2f} {100 * q.energy_rel_err_max:6.2f}"
            f" {q.measured_optimal_freq_mhz:7d} {q.model_optimal_freq_mhz:8d} {100 * q.optimum_regret:7.2f}"
        )
    t = np.concatenate(time_errs)
    e = np.concatenate(energy_errs)
    print(f"\nOver all {len(t)} rows:")
    print(
        f"  time   rel. error median {100 * np.median(t):.2f} %, p95 {100 * np.percentile(t, 95):.2f} %,"
        f" max {100 * t.max():.2f} %"
    )
    print(
        f"  energy rel. error median {100 * np.median(e):.2f} %, p95 {100 * np.percentile(e, 95):.2f} %,"
        f" max {100 * e.max():.2f} %"
    )
    print(
        f"  energy-optimal clock: model − measured = median {np.median(offsets):+.0f} MHz,"
        f" max |Δ| {np.max(np.abs(offsets)):.0f} MHz; energy regret median"
        f" {100 * np.median(regrets):.2f} %, max {100 * np.max(regrets):.2f} %"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
