"""Fit the emulated GPU's power decay after work stops to the energy-window probe on an H200.

    python scripts/calibrate_power_decay.py [--taus-ms 0,5,10,...] [--seeds 3] [--gap-ms 40.6]

On a real H200 (``docs/measurements/h200-2026-11-26``) `benchmarks/sensors_gpu_probe.py`
fitted two kernel mixes' powers from energy windows and overestimated both: heavy +20.8 %,
light +9.5 % against each mix run alone. The likely cause is that a GPU's power does not
fall to idle the moment its last kernel ends. This script replays the probe's shape on an
emulated H100 (the closest spec) in virtual time, with the mixes' measured powers and
durations, for a range of decay time constants τ (`EmulatedGPU(power_decay_s=τ)`):

1. each mix alone (``--alone-s``), 12 instructions back to back per iteration;
2. interleaved for ``--seconds``: ``heavy ×4, (light, heavy) ×2, light ×4`` then an idle gap
   (``--gap-ms``, default 40.6 ms: the probe slept 30 ms, and its two counter reads and the
   synchronisation around each iteration left the GPU idle for the rest; its windows show a
   busy share of 70.8 %);
3. each mix alone again.

The counter (100 ms refresh, 1 % noise, phase drawn per seed) is read every 0.5 ms of
virtual time; a refresh is timed at the middle of the reads around it, as `CounterPoller`
times it. The interleaved phase is cut into energy windows (`perseus.client.gpu.sensing.
energy_windows`) and fitted with the probe's plain least-squares model
(`perseus.schedulers.sweep.power_fit.fit_windows`, whole period: window energy = Σ kind power × busy
seconds + idle power × idle seconds); each mix's alone power is read as the probe reads it.
Printed per τ: the fitted powers and their errors against the alone runs (means over the
seeds), and their distance to the measured errors. ``--drift-per-hour`` adds a drift
(`EmulatedGPU(power_drift_per_hour=...)`) to see what it does to the alone runs.
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perseus.client.gpu.sensing import Tick, energy_windows, periodic_ticks
from perseus.schedulers.measurement import WindowRow
from perseus.schedulers.sweep.power_fit import MODELS, fit_windows
from zeus_power.device import REAL_SENSORS, EmulatedGPU, VirtualClock

# What the H200 probe measured (docs/measurements/h200-2026-11-26/sensors-probe.json).
POWER_W = {"heavy": (694.9 + 693.1) / 2, "light": (546.9 + 511.1) / 2}
"""Each mix's power run alone, the mean of before and after the interleaved phase."""
INTERLEAVED_S = {"heavy": 0.008396, "light": 0.008020}
"""Median instruction times in the interleaved phase."""
ALONE_S = {"heavy": 0.009925, "light": 0.008018}
"""Median instruction times in the alone phases."""
ALONE_GAP_S = 0.00036
"""Host time between two alone iterations (busy share 0.997 of 12 instructions)."""
MEASURED_ERROR = {"heavy": 0.208, "light": 0.095}
"""The fitted powers' errors against the alone runs (whole-period model)."""
MEASURED_IDLE_W = 97.98
"""The same fit's idle power: the mean power of the idle gaps, as the windows tell it."""
PATTERN = ["heavy"] * 4 + ["light", "heavy"] * 2 + ["light"] * 4
ALONE_PER_ITERATION = 12
GPU_TYPE = "H100-SXM"
POLL_S = 0.0005


class Probe:
    """One emulated GPU on a virtual clock, its counter polled as a rank polls it."""

    def __init__(self, tau_s: float, seed: int, drift_per_hour: float) -> None:
        self.clock = VirtualClock()
        self.gpu = EmulatedGPU(
            0,
            gpu_type=GPU_TYPE,
            clock=self.clock,
            seed=seed,
            sensors=REAL_SENSORS,
            power_decay_s=tau_s,
            power_drift_per_hour=drift_per_hour,
        )
        self.ticks: list[Tick] = []
        self._last_read = (self.clock(), self.gpu.total_energy_mj())

    def wait(self, seconds: float) -> None:
        """Let `seconds` of virtual time pass, reading the counter every `POLL_S`."""
        end = self.clock() + seconds
        while self.clock() < end - 1e-12:
            self.clock.advance(min(POLL_S, end - self.clock()))
            now, value = self.clock(), self.gpu.total_energy_mj()
            before, old = self._last_read
            if value != old:
                self.ticks.append(Tick((before + now) / 2, value, True, now - before))
            self._last_read = (now, value)

    def run(self, kind: str, seconds: float) -> tuple[float, float]:
        """One instruction of `kind` (its alone power) for `seconds`: (start, end)."""
        power = POWER_W[kind]
        start = self.clock()
        self.gpu.begin_busy(power)
        self.wait(seconds)
        self.gpu.end_busy(seconds, power * seconds)
        return start, self.clock()


def phase(
    probe: Probe, pattern: list[str], times: dict[str, float], seconds: float, gap_s: float
) -> tuple[list[tuple[int, float, float]], float, float]:
    """Iterations of `pattern` then `gap_s` idle, for `seconds`: (intervals, start, end)."""
    intervals = []
    start = probe.clock()
    while probe.clock() - start < seconds:
        for index, kind in enumerate(pattern):
            intervals.append((index, *probe.run(kind, times[kind])))
        probe.wait(gap_s)
    return intervals, start, probe.clock()


def alone_power(
    intervals: list[tuple[int, float, float]], span: tuple[float, float], ticks: list[Tick], idle_w
) -> float:
    """The probe's reading of a mix run alone: the counter between the phase's first and
    last refresh, the short gaps charged at `idle_w`, over the busy seconds."""
    inside = [k for k in periodic_ticks([k for k in ticks if span[0] <= k.time_s <= span[1]])]
    a, b = inside[0], inside[-1]
    busy = sum(max(0.0, min(e, b.time_s) - max(s, a.time_s)) for _, s, e in intervals)
    energy = (b.energy_mj - a.energy_mj) / 1000
    return (energy - idle_w * (b.time_s - a.time_s - busy)) / busy


def replay(tau_s: float, seed: int, args: argparse.Namespace) -> dict[str, float]:
    """The probe on one emulated GPU: fitted powers, alone powers and errors per mix."""
    probe = Probe(tau_s, seed, args.drift_per_hour)
    probe.wait(0.35)  # the poller learns the period before the phases begin
    alone = {}
    runs = {}
    for name, pattern, seconds, gap in (
        ("heavy alone", ["heavy"] * ALONE_PER_ITERATION, args.alone_s, ALONE_GAP_S),
        ("light alone", ["light"] * ALONE_PER_ITERATION, args.alone_s, ALONE_GAP_S),
        ("interleaved", PATTERN, args.seconds, args.gap_ms / 1000),
        ("heavy alone, after", ["heavy"] * ALONE_PER_ITERATION, args.alone_s, ALONE_GAP_S),
        ("light alone, after", ["light"] * ALONE_PER_ITERATION, args.alone_s, ALONE_GAP_S),
    ):
        times = INTERLEAVED_S if name == "interleaved" else ALONE_S
        runs[name] = phase(probe, pattern, times, seconds, gap)
    probe.wait(0.25)
    intervals, start, end = runs["interleaved"]
    windows = energy_windows(probe.ticks, intervals, len(PATTERN), start_s=start, end_s=end)
    units = [(0, kind, 0) for kind in PATTERN]
    rows = []
    for w in windows:
        busy: dict = {}
        for unit, b in zip(units, w.busy_s, strict=True):
            busy[unit] = busy.get(unit, 0.0) + b
        rows.append(WindowRow(w.energy_j, w.time_s, busy))
    fit = fit_windows(rows, MODELS[0])
    assert fit is not None
    out = {"idle_w": fit.block.power_w, "rms_j": fit.rms_j, "windows": len(rows)}
    for name, (iv, a, b) in runs.items():
        if "alone" in name:
            alone[name] = alone_power(iv, (a, b), probe.ticks, fit.block.power_w)
    for kind in ("heavy", "light"):
        ref = (alone[f"{kind} alone"] + alone[f"{kind} alone, after"]) / 2
        est = fit.units[(0, kind, 0)].power_w
        out[f"{kind}_w"] = est
        out[f"{kind}_alone_w"] = ref
        out[f"{kind}_drift"] = alone[f"{kind} alone, after"] / alone[f"{kind} alone"] - 1
        out[f"{kind}_error"] = est / ref - 1
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--taus-ms", default="0,1,2,3,4,5,10,20,35,50,100,200")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--gap-ms", type=float, default=40.6, help="idle after each iteration")
    parser.add_argument("--seconds", type=float, default=30.0, help="interleaved phase")
    parser.add_argument("--alone-s", type=float, default=6.0, help="each mix alone")
    parser.add_argument("--drift-per-hour", type=float, default=0.0)
    args = parser.parse_args()
    taus = [float(t) / 1000 for t in args.taus_ms.split(",")]
    print(
        f"Emulated {GPU_TYPE}, idle {EmulatedGPU(0, gpu_type=GPU_TYPE).idle_power_w:g} W; "
        f"heavy {POWER_W['heavy']:.1f} W × {INTERLEAVED_S['heavy'] * 1e3:.2f} ms, light "
        f"{POWER_W['light']:.1f} W × {INTERLEAVED_S['light'] * 1e3:.2f} ms; idle gap "
        f"{args.gap_ms:g} ms; {args.seconds:g} s interleaved; {args.seeds} seeds. "
        f"Measured on the H200: heavy {MEASURED_ERROR['heavy']:+.1%}, light "
        f"{MEASURED_ERROR['light']:+.1%}."
    )
    print()
    print(
        "| τ (ms) | heavy fitted (W) | heavy error | light fitted (W) | light error "
        "| idle fitted (W) | residual (J) | distance |"
    )
    print("|---|---|---|---|---|---|---|---|")
    best = None
    idle_curve = []
    for tau in taus:
        runs = [replay(tau, seed, args) for seed in range(args.seeds)]
        mean = {k: statistics.mean(r[k] for r in runs) for k in runs[0]}
        distance = math.hypot(
            mean["heavy_error"] - MEASURED_ERROR["heavy"],
            mean["light_error"] - MEASURED_ERROR["light"],
        )
        if best is None or distance < best[1]:
            best = (tau, distance, mean)
        idle_curve.append((tau, mean["idle_w"]))
        print(
            f"| {tau * 1e3:g} | {mean['heavy_w']:.1f} | {mean['heavy_error']:+.1%} "
            f"| {mean['light_w']:.1f} | {mean['light_error']:+.1%} | {mean['idle_w']:.1f} "
            f"| {mean['rms_j']:.2f} | {distance:.3f} |"
        )
    assert best is not None
    tau, distance, mean = best
    print()
    print(
        f"Closest: τ = {tau * 1e3:g} ms (heavy {mean['heavy_error']:+.1%}, light "
        f"{mean['light_error']:+.1%}; distance {distance:.3f})."
    )
    for (t0, i0), (t1, i1) in itertools.pairwise(idle_curve):
        if (i0 - MEASURED_IDLE_W) * (i1 - MEASURED_IDLE_W) <= 0 and i1 != i0:
            tau_idle = t0 + (t1 - t0) * (MEASURED_IDLE_W - i0) / (i1 - i0)
            print(
                f"The fitted idle power matches the H200's {MEASURED_IDLE_W:.1f} W at "
                f"τ ≈ {tau_idle * 1e3:.1f} ms (between {t0 * 1e3:g} and {t1 * 1e3:g} ms)."
            )
            break
    if args.drift_per_hour:
        print(
            f"Drift {args.drift_per_hour:+g}/h: alone after vs before, heavy "
            f"{mean['heavy_drift']:+.2%}, light {mean['light_drift']:+.2%}."
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
