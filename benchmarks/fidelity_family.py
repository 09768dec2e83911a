"""A seeded family of pipeline jobs nobody tuned the profiler for (`bench_profile_fidelity.py`).

Each job is drawn from one seed: a schedule (1F1B, interleaved with two chunks, zero
bubble), 2–16 pipeline ranks, a number of microbatches, stages unbalanced up to 3×,
instruction times of 1–100 ms at the max clock, 1–3 % timing jitter per execution, power
that decays after work stops with a time constant of 3–30 ms (3 ms is what the H200's gaps
showed, `scripts/calibrate_power_decay.py`; tens of ms is what was feared), and slow drift
(up to ±5 % an hour).

Every (stage, kind) gets its own time and power curves over the A40's clocks from 1740 down
to 855 MHz, drawn *around the published A40 profiles* (`../shared/data`: GPT-3 175B and
Bloom 176B, 8 stages × forward/backward, measured): the mix of two measured curves of the
same kind (forward from forwards, every backward kind from backwards) with a random weight,
its power scaled by a random factor, smoothed (the published rows carry their own
measurement noise, which is not a physical curve) and made physical (time does not fall as
the clock falls, power does not rise; power within the A40's idle and its 300 W limit). So
the curves have the real profiles' shapes (power-capped tops, the knee) and none of the
emulator's DVFS formula: an estimator that assumed that formula would gain nothing here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.signal import savgol_filter

from perseus.domain.schedule import PipelineSchedule, make_schedule
from zeus_power.device import SensorSpec

__all__ = ["CLOCKS", "GPU_TYPE", "SENSORS", "JobShape", "data_dir", "draw_job", "family"]

GPU_TYPE = "A40"
CLOCKS = list(range(1740, 854, -15))
"""The published profiles' clocks (60): the family's GPUs offer these."""
IDLE_W = 30.0
LIMIT_W = 300.0
SENSORS = SensorSpec(period_s=0.1, window=0.25, read_latency_s=0.0, noise=0.01)
"""The emulator's real-like sensors as a 25 %-sampling A100/H100 shows them (the read's
cost is the simulated poller's spacing, 2.4 ms; in virtual time a read takes none)."""
SCHEDULES = ("1f1b", "interleaved", "zb")
SPLIT_SHARE = {"backward_input": 0.55, "backward_weight": 0.45}
"""A split backward's halves, as shares of the whole backward's time."""


def data_dir() -> Path:
    """``../shared/data`` beside the repository."""
    return Path(__file__).resolve().parents[2] / "shared" / "data"


@cache
def _curves() -> dict[str, list[tuple[np.ndarray, np.ndarray]]]:
    """Per kind ('forward', 'backward'), every published (stage) curve: time relative to
    the max clock's, and power (W), both over `CLOCKS`, smoothed and made physical."""
    out: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {"forward": [], "backward": []}
    for path in sorted(data_dir().glob("sosp24_*_a40_8stage.csv")):
        frame = pd.read_csv(path)
        for (_, kind), rows in frame.groupby(["stage", "instruction"]):
            rows = rows.set_index("frequency").reindex(CLOCKS)
            t = rows["time"].to_numpy(float)
            p = (rows["energy"] / rows["time"]).to_numpy(float)
            t = np.exp(savgol_filter(np.log(t), 11, 2))
            p = np.exp(savgol_filter(np.log(p), 11, 2))
            # CLOCKS run from the top down: time never falls, power never rises, as it goes.
            t = np.maximum.accumulate(t)
            p = np.minimum.accumulate(np.minimum(p, LIMIT_W))
            out[str(kind)].append((t / t[0], p))
    if not out["forward"]:
        raise FileNotFoundError(f"no published A40 profile in {data_dir()}")
    return out


@dataclass(frozen=True)
class JobShape:
    """One drawn job: its schedule, its instructions' curves and its disturbances."""

    index: int
    schedule_name: str
    ranks: int
    microbatches: int
    imbalance: float
    """Heaviest stage's work over the lightest's."""
    jitter: float
    decay_s: float
    drift_per_hour: float
    switch_latency_s: float
    """How long a clock change takes to land (10–20 ms, as `nvmlDeviceSetGpuLockedClocks`
    is reported to take): until then the GPU runs the clock before it."""
    stage_work: tuple[float, ...]
    forward_s: float
    """The lightest stage's forward at the max clock."""
    backward_ratio: float
    curves: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = field(repr=False)
    """(stage, kind) → (time s over `CLOCKS`, power W over `CLOCKS`)."""

    @property
    def name(self) -> str:
        return (
            f"#{self.index} {self.schedule_name} {self.ranks}x{self.microbatches} "
            f"imb {self.imbalance:.1f} F {self.forward_s * 1000:.1f} ms"
        )

    def schedule(self) -> PipelineSchedule:
        return make_schedule(self.schedule_name, self.ranks, self.microbatches)

    def truth(self, stage: int, kind: str, freq: int) -> tuple[float, float]:
        """(time s, power W) of one instruction at `freq`."""
        t, p = self.curves[stage, kind]
        i = CLOCKS.index(freq)
        return float(t[i]), float(p[i])


def draw_job(seed: int, index: int, *, max_ranks: int = 16) -> JobShape:
    """Job `index` of the family drawn from `seed`."""
    rng = np.random.default_rng([seed, index])
    name = SCHEDULES[int(rng.integers(len(SCHEDULES)))]
    ranks = int(rng.integers(2, max_ranks + 1))
    microbatches = (
        ranks * int(rng.integers(1, 3))
        if name == "interleaved"
        else ranks + int(rng.integers(0, ranks + 1))
    )
    stages = ranks * 2 if name == "interleaved" else ranks
    imbalance = float(rng.uniform(1.0, 3.0))
    work = rng.uniform(1.0, imbalance, stages)
    work[rng.permutation(stages)[:2]] = (1.0, imbalance)
    backward_ratio = float(rng.uniform(1.5, 2.5))
    # Every instruction at the max clock within 1–100 ms.
    longest = imbalance * backward_ratio
    forward_s = math.exp(rng.uniform(math.log(1e-3), math.log(0.1 / longest)))
    kinds = {"1f1b": ("forward", "backward"), "interleaved": ("forward", "backward")}.get(
        name, ("forward", "backward_input", "backward_weight")
    )
    pool = _curves()
    curves: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = {}
    for stage in range(stages):
        for kind in kinds:
            source = pool["forward" if kind == "forward" else "backward"]
            a, b = rng.choice(len(source), 2, replace=False)
            w = float(rng.uniform())
            rel = w * source[a][0] + (1 - w) * source[b][0]
            power = (w * source[a][1] + (1 - w) * source[b][1]) * float(rng.uniform(0.75, 1.05))
            power = np.clip(power, IDLE_W + 20.0, LIMIT_W)
            base = forward_s * float(work[stage])
            if kind != "forward":
                base *= backward_ratio * SPLIT_SHARE.get(kind, 1.0)
            curves[stage, kind] = (base * rel, power)
    return JobShape(
        index=index,
        schedule_name=name,
        ranks=ranks,
        microbatches=microbatches,
        imbalance=imbalance,
        jitter=float(rng.uniform(0.01, 0.03)),
        decay_s=float(math.exp(rng.uniform(math.log(0.003), math.log(0.03)))),
        drift_per_hour=float(rng.uniform(-0.05, 0.05)),
        # Its own stream: the family's other draws stay those of the seed.
        switch_latency_s=float(np.random.default_rng([seed, index, 1]).uniform(0.010, 0.020)),
        stage_work=tuple(float(x) for x in work),
        forward_s=forward_s,
        backward_ratio=backward_ratio,
        curves=curves,
    )


def family(seed: int, jobs: int, *, max_ranks: int = 16, start: int = 0) -> list[JobShape]:
    """`jobs` jobs of the family drawn from `seed`, from job `start` on."""
    return [draw_job(seed, i, max_ranks=max_ranks) for i in range(start, start + jobs)]
