"""Synthetic instruction profiles from the emulator's DVFS model.

A profile lists, for every pipeline stage, instruction (forward/backward, and with
`backward_split` the backward's halves backward_input/backward_weight) and supported SM
clock, the time (s) and energy (J) of one instruction on one microbatch on one GPU: the
same ``stage,instruction,frequency,time,energy`` table that real profiling writes. The
numbers come from `zeus_power.device.emulated.DVFSModel`, the very equations the emulated
GPUs run, under the GPU type's default power limit (so the top clocks are power-capped as
on real hardware).

```python
from perseus.synth import stage_workloads, synthesize_profile

frame = synthesize_profile("A40", [1, 1, 1, 1, 1, 1, 1, 0.6], preset="bloom")
frame = synthesize_profile("A100-SXM", stage_workloads("A100-SXM", [1.0, 1.3], base_forward_ms=40))
```

The device model is the ground truth that profiles are drawn from, so this module (the
producer of profiles) reads `zeus_power.device`; nothing downstream of profiles does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import pandas as pd

from perseus.domain.kinds import PROFILE_COLUMNS
from perseus.errors import ConfigurationError, ProfileError
from perseus.memory import memory_shortfall
from zeus_power.device.calibration import MeasuredSweep, fit_workload
from zeus_power.device.emulated import DVFSModel, Workload
from zeus_power.device.specs import get_gpu_spec

__all__ = [
    "COLUMNS",
    "MODEL_PRESETS",
    "ModelPreset",
    "check_stage_count",
    "fit_stage_workloads",
    "get_preset",
    "stage_workloads",
    "synthesize_profile",
]

COLUMNS = list(PROFILE_COLUMNS)
"""Columns of a profile table, in order (`perseus.domain.kinds.PROFILE_COLUMNS`)."""


@dataclass(frozen=True, kw_only=True)
class ModelPreset:
    """Typical per-stage work of a model family (one stage of work factor 1.0)."""

    base_forward_ms: float
    """Forward time of a stage with work 1.0 at the max SM clock, default power limit."""
    memory_fraction: float
    """Share of that time that does not scale with the SM clock."""
    activity: float
    """Dynamic-power activity (see `Workload.activity`)."""
    backward_ratio: float = 2.0
    """Backward work over forward work."""
    description: str = ""


MODEL_PRESETS: Mapping[str, ModelPreset] = MappingProxyType(
    {
        "generic": ModelPreset(
            base_forward_ms=100.0,
            memory_fraction=0.3,
            activity=0.8,
            description="A transformer stage; 100 ms forward",
        ),
        "gpt3": ModelPreset(
            base_forward_ms=112.0,
            memory_fraction=0.5,
            activity=0.79,
            description="GPT-3 175B stage (TP 8) on an A40, as fitted to the SOSP'24 profile",
        ),
        "gpt3-xl": ModelPreset(
            base_forward_ms=35.0,
            memory_fraction=0.3,
            activity=0.8,
            description="GPT-3 XL (1.3B) quarter: 6 layers, microbatch 4 x 2048 tokens",
        ),
        "bloom": ModelPreset(
            base_forward_ms=130.0,
            memory_fraction=0.6,
            activity=0.76,
            description="Bloom 176B stage (TP 8) on an A40, as fitted to the SOSP'24 profile",
        ),
        "t5": ModelPreset(
            base_forward_ms=50.0,
            memory_fraction=0.35,
            activity=0.75,
            description="T5 (3B) encoder/decoder stage",
        ),
    }
)
"""Model families for `synthesize_profile(preset=...)` and `perseus profile synth --model`."""


def get_preset(name: str) -> ModelPreset:
    """A preset by name; `ConfigurationError` listing the valid names otherwise."""
    try:
        return MODEL_PRESETS[name]
    except KeyError:
        raise ConfigurationError(
            f"Unknown model preset {name!r}; valid presets: {', '.join(sorted(MODEL_PRESETS))}"
        ) from None


_BYTES_PER_STAGE = 64 * 1024
"""Peak memory of synthesizing and writing one stage (~200 rows), measured on the A40."""


def check_stage_count(num_stages: int) -> None:
    """Refuse a stage count whose profile cannot fit in memory, before building anything."""
    short = memory_shortfall(num_stages * _BYTES_PER_STAGE, f"A profile of {num_stages:,} stages")
    if short:
        raise ConfigurationError(f"{short}; synthesize fewer stages")


def _check_work(work: Sequence[float]) -> list[float]:
    check_stage_count(len(work))
    factors = [float(w) for w in work]
    if not factors:
        raise ConfigurationError("A profile needs at least one stage; got an empty work list")
    for stage, factor in enumerate(factors):
        if not (np.isfinite(factor) and factor > 0):
            raise ConfigurationError(
                f"Work of stage {stage} is {factor}; every stage's work must be a positive number"
            )
    return factors


def stage_workloads(
    gpu_type: str,
    work: Sequence[float],
    *,
    base_forward_ms: float,
    memory_fraction: float = 0.3,
    activity: float = 0.8,
    backward_ratio: float = 2.0,
) -> list[tuple[Workload, Workload]]:
    """(forward, backward) workloads per stage from relative work factors.

    A stage of work `w` has a forward taking `w * base_forward_ms` at the max SM clock under
    `gpu_type`'s default power limit, and a backward `backward_ratio` times as much work.
    """
    factors = _check_work(work)
    for name, value in (("base_forward_ms", base_forward_ms), ("backward_ratio", backward_ratio)):
        if not (np.isfinite(value) and value > 0):
            raise ConfigurationError(f"{name}={value} must be a positive number")
    if not 0.0 <= memory_fraction <= 1.0:
        raise ConfigurationError(f"memory_fraction={memory_fraction} must be in [0, 1]")
    if not (np.isfinite(activity) and activity > 0):
        raise ConfigurationError(f"activity={activity} must be a positive number")
    model = DVFSModel(gpu_type)
    unit = Workload.from_memory_fraction(memory_fraction, activity=activity)
    unit_s = model.time_s(unit, None, model.spec.default_power_limit_w)
    forward = unit.scaled(base_forward_ms / 1000.0 / unit_s)
    return [(forward.scaled(f), forward.scaled(f * backward_ratio)) for f in factors]


def synthesize_profile(
    gpu_type: str,
    stage_workloads: Sequence[tuple[Workload, Workload]] | Sequence[float],
    *,
    seed: int | None = None,
    noise: float = 0.0,
    preset: str = "generic",
    min_freq_mhz: int | None = None,
    power_limit_w: float | None = None,
    backward_split: float | None = None,
) -> pd.DataFrame:
    """The profile table of `stage_workloads` on `gpu_type`.

    The stages are pipeline (virtual) stages: for an interleaved or V-shaped schedule give
    one workload per stage of the model (ranks × stages per rank).

    Args:
        gpu_type: An emulated GPU type, e.g. "A40" (see `zeus_power.device.specs`).
        stage_workloads: Per stage, a (forward, backward) `Workload` pair, or a relative
            work factor expanded with `preset` (see `stage_workloads`).
        seed: Seed of the noise.
        noise: Relative standard deviation of log-normal noise on time and on power (0: exact).
        preset: Model preset for work factors (see `MODEL_PRESETS`).
        min_freq_mhz: Leave out clocks below this (default: every supported clock).
        power_limit_w: Power limit during "profiling" (default: the GPU's default limit).
        backward_split: Also write a split backward for zero-bubble schedules: at every
            clock ``backward_input`` takes this fraction of the (noisy) backward's time and
            energy and ``backward_weight`` the rest, so I + W = B exactly. 0.5 is the
            zero-bubble paper's assumption (T_F ≈ T_I ≈ T_W with a backward of twice the
            forward's work). None (default): forward and backward rows only. The backward
            rows stay either way, so one profile serves 1F1B and ZB alike.

    Returns:
        Columns `COLUMNS`; one row per stage, frequency (descending) and instruction.
    """
    spec = get_gpu_spec(gpu_type)
    items = list(stage_workloads)
    check_stage_count(len(items))
    if items and all(isinstance(item, tuple) for item in items):
        pairs = [
            (_as_workload(f, s, "forward"), _as_workload(b, s, "backward"))
            for s, (f, b) in enumerate(items)
        ]  # type: ignore[misc]
    elif all(isinstance(item, (int, float)) and not isinstance(item, bool) for item in items):
        p = get_preset(preset)
        pairs = _expand(spec.gpu_type, items, p)  # type: ignore[arg-type]
    else:
        raise ConfigurationError(
            "stage_workloads must be a list of (forward, backward) Workload pairs or a list of "
            "positive work factors"
        )
    if not (np.isfinite(noise) and noise >= 0):
        raise ConfigurationError(f"noise={noise} must be a non-negative number")
    if backward_split is not None and not (
        np.isfinite(backward_split) and 0.0 < backward_split < 1.0
    ):
        raise ConfigurationError(
            f"backward_split={backward_split} must be in (0, 1): the share of the backward's "
            "time and energy that its input-gradient half takes"
        )
    model = DVFSModel(spec)
    clocks = np.array(model.supported_sm_clocks_mhz())
    if min_freq_mhz is not None:
        clocks = clocks[clocks >= min_freq_mhz]
        if clocks.size == 0:
            raise ConfigurationError(
                f"min_freq_mhz={min_freq_mhz} leaves no clock; the {spec.gpu_type}'s highest is "
                f"{spec.max_sm_clock_mhz} MHz"
            )
    limit_w = spec.default_power_limit_w if power_limit_w is None else power_limit_w
    rng = np.random.default_rng(seed)
    columns: dict[str, list] = {name: [] for name in COLUMNS}
    sweeps = [[model.sweep(w, clocks, limit_w) for w in pair] for pair in pairs]
    def add(stage: int, instruction: str, freq: int, time_s: float, energy_j: float) -> None:
        columns["stage"].append(stage)
        columns["instruction"].append(instruction)
        columns["frequency"].append(freq)
        columns["time"].append(time_s)
        columns["energy"].append(energy_j)

    for stage, (fwd, bwd) in enumerate(sweeps):
        for i, freq in enumerate(clocks):
            for instruction, sweep in (("forward", fwd), ("backward", bwd)):
                time_s = float(sweep.time_s[i])
                power_w = float(sweep.power_w[i])
                if noise:
                    time_s *= float(np.exp(rng.normal(0.0, noise)))
                    power_w *= float(np.exp(rng.normal(0.0, noise)))
                add(stage, instruction, int(freq), time_s, power_w * time_s)
                if instruction == "backward" and backward_split is not None:
                    for half, share in (
                        ("backward_input", backward_split),
                        ("backward_weight", 1.0 - backward_split),
                    ):
                        add(stage, half, int(freq), share * time_s, share * power_w * time_s)
    return pd.DataFrame(columns, columns=COLUMNS)


def _as_workload(value: object, stage: int, instruction: str) -> Workload:
    if not isinstance(value, Workload):
        raise ConfigurationError(
            f"Stage {stage} {instruction} is a {type(value).__name__}, not a Workload"
        )
    return value


def _expand(
    gpu_type: str, work: Sequence[float], preset: ModelPreset
) -> list[tuple[Workload, Workload]]:
    return stage_workloads(
        gpu_type,
        work,
        base_forward_ms=preset.base_forward_ms,
        memory_fraction=preset.memory_fraction,
        activity=preset.activity,
        backward_ratio=preset.backward_ratio,
    )


def fit_stage_workloads(frame: pd.DataFrame, gpu_type: str) -> list[tuple[Workload, Workload]]:
    """Per stage, the (forward, backward) workloads that reproduce a measured profile table.

    The inverse of `synthesize_profile`: lets emulated GPUs run a real model's instructions.
    Needs at least three frequencies per instruction.
    """
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise ProfileError(f"Profile table lacks column(s) {', '.join(missing)}")
    model = DVFSModel(gpu_type)
    stages = sorted({int(s) for s in frame["stage"]})
    if stages != list(range(len(stages))):
        raise ProfileError(f"Profile stages {stages} are not numbered 0..S-1")
    pairs = []
    for stage in stages:
        fitted = []
        for instruction in ("forward", "backward"):
            rows = frame[(frame["stage"] == stage) & (frame["instruction"] == instruction)]
            if len(rows) < 3:
                raise ProfileError(
                    f"Stage {stage} {instruction} has {len(rows)} row(s); fitting needs >= 3 clocks"
                )
            m = MeasuredSweep(
                rows["frequency"].to_numpy(), rows["time"].to_numpy(), rows["energy"].to_numpy()
            )
            fitted.append(fit_workload(model, m))
        pairs.append((fitted[0], fitted[1]))
    return pairs
