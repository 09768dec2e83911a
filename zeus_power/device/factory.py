"""`open_gpus` and the device settings it reads (`DeviceSettings`, `ZEUS_*`); the package
`zeus_power.device` hands these out with the rest of the device layer."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from zeus_power.device.base import GPU, GPUInitError, GPUValueError, load_env_settings
from zeus_power.device.emulated import MAX_POWER_DECAY_S, MAX_POWER_DRIFT_PER_HOUR, EmulatedGPU
from zeus_power.device.sensors import IDEAL_SENSORS, REAL_SENSORS, SensorSpec
from zeus_power.device.specs import GPUSpec, get_gpu_spec

__all__ = [
    "BACKENDS",
    "CALIBRATED_POWER_DECAY_S",
    "DEFAULT_SWITCH_LATENCY_MS",
    "MAX_SWITCH_LATENCY_MS",
    "DeviceSettings",
    "open_gpus",
]

logger = logging.getLogger(__name__)

DEFAULT_SWITCH_LATENCY_MS = 15.0
"""Default SM clock switching latency of emulated GPUs (docs/emulator.md says where from)."""
MAX_SWITCH_LATENCY_MS = 10_000.0
CALIBRATED_POWER_DECAY_S = 0.003
"""Time constant of the power's fall after work stops fitted to the energy-window probe on
a real H200 (`scripts/calibrate_power_decay.py`): the τ at which the emulated probe's idle
gaps draw what the H200's did (the fit's idle power, 98 W). No τ reproduces that fit's
per-kind errors (docs/emulator.md, "Power after work stops, and drift"). Not the default:
an emulated GPU's power drops to idle at once unless `ZEUS_EMULATED_POWER_DECAY_MS` or
`EmulatedGPU(power_decay_s=...)` says otherwise."""

BACKENDS = ("auto", "emulated", "nvml", "zeusd")
"""Valid values of `open_gpus(backend=...)` and `ZEUS_GPU_BACKEND`."""


class DeviceSettings(BaseSettings):
    """Device-layer settings, read from `ZEUS_*` environment variables."""

    model_config = SettingsConfigDict(env_prefix="ZEUS_", extra="forbid", frozen=True)

    gpu_backend: Literal["auto", "emulated", "nvml", "zeusd"] = "auto"
    """`ZEUS_GPU_BACKEND`: which backend `open_gpus` uses when none is passed."""
    emulated_gpu: str = "A100-SXM"
    """`ZEUS_EMULATED_GPU`: the emulated GPU type."""
    emulated_gpu_count: int | None = Field(default=None, ge=1)
    """`ZEUS_EMULATED_GPU_COUNT`: how many emulated GPUs exist (default 1, or the indices asked)."""
    emulated_noise: float = Field(default=0.0, ge=0.0)
    """`ZEUS_EMULATED_NOISE`: relative std of the emulator's measurement noise (0: exact)."""
    emulated_switch_latency_ms: float = Field(
        default=DEFAULT_SWITCH_LATENCY_MS, ge=0.0, le=MAX_SWITCH_LATENCY_MS
    )
    """`ZEUS_EMULATED_SWITCH_LATENCY_MS`: how long a new SM clock takes to come into force
    on an emulated GPU (default: 15 ms, the middle of the 10–20 ms reported for
    `nvmlDeviceSetGpuLockedClocks`; see docs/emulator.md)."""
    emulated_power_decay_ms: float = Field(
        default=0.0, ge=0.0, le=MAX_POWER_DECAY_S * 1000, allow_inf_nan=False
    )
    """`ZEUS_EMULATED_POWER_DECAY_MS`: time constant of an emulated GPU's power falling to
    idle after work stops (default 0: at once; 0–1000; `CALIBRATED_POWER_DECAY_S` is the
    value fitted to a real H200, see docs/emulator.md)."""
    emulated_power_drift_per_hour: float = Field(
        default=0.0,
        ge=-MAX_POWER_DRIFT_PER_HOUR,
        le=MAX_POWER_DRIFT_PER_HOUR,
        allow_inf_nan=False,
    )
    """`ZEUS_EMULATED_POWER_DRIFT_PER_HOUR`: relative change per hour of an emulated GPU's
    busy power above idle (default 0: none; −0.5–0.5; see docs/emulator.md)."""
    emulated_sensors: Literal["real", "ideal"] = "real"
    """`ZEUS_EMULATED_SENSORS`: ``real`` (default): the energy counter and power readings
    refresh as below, as on a real GPU; ``ideal``: exact and continuous, which no GPU shows
    (for tests that need exact energy; the settings below are then ignored)."""
    emulated_sensor_period_ms: float = Field(
        default=REAL_SENSORS.period_s * 1000, gt=0.0, le=10_000.0
    )
    """`ZEUS_EMULATED_SENSOR_PERIOD_MS`: refresh period of the counter and power readings
    (default 100, measured on an H100)."""
    emulated_sensor_window: float = Field(default=REAL_SENSORS.window, gt=0.0, le=1.0)
    """`ZEUS_EMULATED_SENSOR_WINDOW`: share of each period the sensor samples (default 1;
    0.25 on A100 and H100 per arXiv 2312.02741)."""
    emulated_sensor_read_ms: float = Field(
        default=REAL_SENSORS.read_latency_s * 1000, ge=0.0, le=1000.0
    )
    """`ZEUS_EMULATED_SENSOR_READ_MS`: how long one counter read takes (default 2.4)."""
    emulated_sensor_noise: float = Field(default=REAL_SENSORS.noise, ge=0.0, le=1.0)
    """`ZEUS_EMULATED_SENSOR_NOISE`: relative std of each refresh's energy (default 0.01)."""

    def sensor_spec(self) -> SensorSpec:
        """The sensors these settings describe."""
        if self.emulated_sensors == "ideal":
            return IDEAL_SENSORS
        return SensorSpec(
            period_s=self.emulated_sensor_period_ms / 1000.0,
            window=self.emulated_sensor_window,
            read_latency_s=self.emulated_sensor_read_ms / 1000.0,
            noise=self.emulated_sensor_noise,
        )


def _load_settings() -> DeviceSettings:
    return load_env_settings(DeviceSettings, "device")


def open_gpus(
    indices: Sequence[int] | None = None,
    *,
    backend: str | None = None,
    gpu_type: str | None = None,
    clock: Callable[[], float] | None = None,
    seed: int | None = None,
    noise: float | None = None,
) -> list[GPU]:
    """Open GPUs by (CUDA-visible) index; default: all of them.

    Args:
        indices: Which GPUs; `None` opens every visible GPU (emulated: `ZEUS_EMULATED_GPU_COUNT`).
        backend: "nvml", "emulated", "zeusd" or "auto" (the daemon when `ZEUSD_*` is set,
            else NVML; never the emulator unless asked for); default `ZEUS_GPU_BACKEND`, else
            "auto".
        gpu_type: Emulated GPU type; default `ZEUS_EMULATED_GPU`, else "A100-SXM".
        clock: Time source for emulated GPUs (e.g. a shared `VirtualClock`).
        seed: Seed of the emulator's noise (each GPU draws from its own stream).
        noise: Emulator noise level; default `ZEUS_EMULATED_NOISE`, else 0.

    Raises:
        GPUValueError: Unknown backend or GPU type, or bad settings.
        GPUInitError: NVML asked for (or `auto`) but unavailable, the message naming the
            opt-in `ZEUS_GPU_BACKEND=emulated`; an index out of range.
    """
    settings = _load_settings()
    chosen = settings.gpu_backend if backend is None else backend.strip().lower()
    if chosen not in BACKENDS:
        raise GPUValueError(
            f"Unknown GPU backend {backend!r}; valid backends: {', '.join(BACKENDS)}"
        )
    if indices is not None:
        indices = [int(i) for i in indices]
        if len(set(indices)) != len(indices):
            raise GPUValueError(f"GPU indices {indices} contain duplicates")
    if chosen == "zeusd" or (chosen == "auto" and _zeusd_configured()):
        return _open_zeusd(indices, settings, clock=clock, seed=seed, noise=noise)
    if chosen == "emulated":
        logger.info(
            "Emulated GPUs, as asked for: their times and energies come from a model; sensors: %s",
            settings.sensor_spec().describe(),
        )
        return _open_emulated(
            indices, settings, gpu_type=gpu_type, clock=clock, seed=seed, noise=noise
        )
    from zeus_power.device.nvml import open_nvml_gpus

    try:
        return list(open_nvml_gpus(indices))
    except GPUInitError as exc:
        # `auto` never falls back to the emulator: on a GPU node whose driver failed to load,
        # that would stretch real training with sleeps and report invented energy.
        reason = str(exc) if str(exc).endswith(("?", ".")) else f"{exc}."
        how = "opt in with ZEUS_GPU_BACKEND=emulated (or backend='emulated')"
        if chosen == "auto":
            how = (
                "ZEUS_GPU_BACKEND=auto (the default) uses NVML and never emulates silently: "
                f"to run on emulated GPUs, {how}"
            )
        else:
            how = f"To run on emulated GPUs instead, {how}"
        raise GPUInitError(f"{reason} {how}") from exc


def _open_emulated(
    indices: list[int] | None,
    settings: DeviceSettings,
    *,
    gpu_type: str | None,
    clock: Callable[[], float] | None,
    seed: int | None,
    noise: float | None,
) -> list[GPU]:
    spec = get_gpu_spec(settings.emulated_gpu if gpu_type is None else gpu_type)
    count = settings.emulated_gpu_count
    if indices is None:
        indices = list(range(count or 1))
    for index in indices:
        if index < 0 or (count is not None and index >= count):
            limit = "" if count is None else f" (ZEUS_EMULATED_GPU_COUNT={count})"
            raise GPUInitError(f"Emulated GPU index {index} is out of range{limit}")
    return [
        EmulatedGPU(
            index,
            gpu_type=spec,
            clock=time.monotonic if clock is None else clock,
            seed=seed,
            noise=settings.emulated_noise if noise is None else noise,
            switch_latency_s=settings.emulated_switch_latency_ms / 1000.0,
            sensors=settings.sensor_spec(),
            power_decay_s=settings.emulated_power_decay_ms / 1000.0,
            power_drift_per_hour=settings.emulated_power_drift_per_hour,
        )
        for index in indices
    ]


def _zeusd_configured() -> bool:
    """Whether `ZEUSD_SOCK_PATH` or `ZEUSD_HOST_PORT` is set (`auto` then uses the daemon)."""
    from zeus_power.device.zeusd_client import load_zeusd_settings

    return load_zeusd_settings().configured


def _open_zeusd(
    indices: list[int] | None,
    settings: DeviceSettings,
    *,
    clock: Callable[[], float] | None,
    seed: int | None,
    noise: float | None,
) -> list[GPU]:
    """GPUs whose writes go through zeusd (`zeus_power.device.zeusd`)."""
    from zeus_power.device.zeusd import open_zeusd_gpus

    def mirror(index: int, spec: GPUSpec) -> GPU:
        return EmulatedGPU(
            index,
            gpu_type=spec,
            clock=time.monotonic if clock is None else clock,
            seed=seed,
            noise=settings.emulated_noise if noise is None else noise,
            privileged=False,  # the job's copy; only the daemon changes the GPU
            sensors=settings.sensor_spec(),
            power_decay_s=settings.emulated_power_decay_ms / 1000.0,
            power_drift_per_hour=settings.emulated_power_drift_per_hour,
        )

    return open_zeusd_gpus(indices, emulated=mirror)
