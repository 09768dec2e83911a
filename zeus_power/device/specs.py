"""Per-GPU-type parameters of the emulator's DVFS model.

Clock ranges, memory clocks and power-limit ranges are the real ones reported by NVML on
each product. The power-curve parameters (`static_power_w`, `dynamic_power_w`,
`voltage_floor`, `knee_mhz`, `voltage_exponent`) of the A40 are fitted to the measured
A40 profiles (see `docs/emulator.md` and `scripts/calibrate_emulator.py`); the A100 and
H100 reuse the A40's curve shape scaled to their clock range and power envelope.
`p2p_block_power_w` is measured for the A40 (70.38 W) and A100 (83.64 W) in the Perseus
artifact. For the H100, the idle and spin-kernel (P2P-blocking) power and the scale of
`dynamic_power_w` were read on one real H100 with `benchmarks/nvml_probe.py`, without
changing its clocks (see `docs/emulator.md`); its curve shape is still assumed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from zeus_power.device.base import GPUValueError

__all__ = ["GPU_SPECS", "GPUSpec", "get_gpu_spec", "gpu_type_names"]


@dataclass(frozen=True, kw_only=True)
class GPUSpec:
    """Everything the emulator knows about one GPU type. All fields are validated on build."""

    gpu_type: str
    """Short registry name, e.g. "A100-SXM"."""
    product_name: str
    """What NVML's `nvmlDeviceGetName` reports for the real product."""
    max_sm_clock_mhz: int
    """Highest supported SM clock."""
    min_sm_clock_mhz: int
    """Lowest supported SM clock."""
    sm_clock_step_mhz: int = 15
    """Spacing of the supported SM clocks."""
    memory_clocks_mhz: tuple[int, ...]
    """Supported memory clocks, descending."""
    min_power_limit_w: float
    """Lowest settable power limit."""
    max_power_limit_w: float
    """Highest settable power limit (the board's TDP)."""
    default_power_limit_w: float
    """Factory power limit."""
    idle_power_w: float
    """Power with nothing running; the energy counter accrues it over wall time."""
    p2p_block_power_w: float
    """Power while blocked on peer-to-peer communication (a pipeline bubble)."""
    static_power_w: float
    """Frequency-independent part of the busy power (leakage, memory, uncore)."""
    dynamic_power_w: float
    """Dynamic power at the max SM clock for a workload with activity 1.0."""
    voltage_floor: float
    """Core voltage at and below the knee, relative to the voltage at the max clock."""
    knee_mhz: float
    """SM clock above which the voltage rises from the floor."""
    voltage_exponent: float = 1.0
    """Shape of the voltage rise above the knee (1.0: linear in frequency)."""
    energy_counter: bool = True
    """Whether the product has an energy counter (Volta and newer)."""
    notes: str = field(default="", compare=False)
    """Where the figures come from."""

    def __post_init__(self) -> None:
        problems: list[str] = []
        if not 0 < self.min_sm_clock_mhz <= self.max_sm_clock_mhz:
            problems.append(
                f"SM clock range {self.min_sm_clock_mhz}..{self.max_sm_clock_mhz} MHz is empty"
            )
        if self.sm_clock_step_mhz <= 0:
            problems.append(f"sm_clock_step_mhz={self.sm_clock_step_mhz} must be positive")
        elif (self.max_sm_clock_mhz - self.min_sm_clock_mhz) % self.sm_clock_step_mhz:
            problems.append(
                f"SM clock range {self.min_sm_clock_mhz}..{self.max_sm_clock_mhz} MHz is not "
                f"a multiple of the {self.sm_clock_step_mhz} MHz step"
            )
        if not self.memory_clocks_mhz or list(self.memory_clocks_mhz) != sorted(
            self.memory_clocks_mhz, reverse=True
        ):
            problems.append(
                f"memory_clocks_mhz={self.memory_clocks_mhz} must be non-empty, descending"
            )
        if not (0 < self.min_power_limit_w <= self.default_power_limit_w <= self.max_power_limit_w):
            problems.append(
                "power limits must satisfy 0 < min <= default <= max, got "
                f"{self.min_power_limit_w}, {self.default_power_limit_w}, {self.max_power_limit_w} W"
            )
        for name in ("idle_power_w", "p2p_block_power_w", "static_power_w", "dynamic_power_w"):
            if getattr(self, name) <= 0:
                problems.append(f"{name}={getattr(self, name)} must be positive")
        if not 0 < self.voltage_floor <= 1:
            problems.append(f"voltage_floor={self.voltage_floor} must be in (0, 1]")
        if not self.min_sm_clock_mhz <= self.knee_mhz < self.max_sm_clock_mhz:
            problems.append(
                f"knee_mhz={self.knee_mhz} must lie in [{self.min_sm_clock_mhz}, "
                f"{self.max_sm_clock_mhz})"
            )
        if self.voltage_exponent <= 0:
            problems.append(f"voltage_exponent={self.voltage_exponent} must be positive")
        if problems:
            raise GPUValueError(f"Invalid GPU spec {self.gpu_type!r}: " + "; ".join(problems))

    @property
    def max_power_w(self) -> float:
        """The most the board may draw: its highest settable power limit (TDP)."""
        return self.max_power_limit_w

    def supported_sm_clocks_mhz(self) -> list[int]:
        """Supported SM clocks, descending."""
        return list(
            range(self.max_sm_clock_mhz, self.min_sm_clock_mhz - 1, -self.sm_clock_step_mhz)
        )


# The A40 power curve comes from `scripts/calibrate_emulator.py` on the SOSP'24 A40 profiles.
_A40 = GPUSpec(
    gpu_type="A40",
    product_name="NVIDIA A40",
    max_sm_clock_mhz=1740,
    min_sm_clock_mhz=210,
    memory_clocks_mhz=(7251,),
    min_power_limit_w=100.0,
    max_power_limit_w=300.0,
    default_power_limit_w=300.0,
    idle_power_w=30.0,
    p2p_block_power_w=70.38,
    static_power_w=111.0,
    dynamic_power_w=330.0,
    voltage_floor=0.726,
    knee_mhz=1075.0,
    voltage_exponent=0.91,
    notes="Power curve fitted to SOSP'24 GPT-3/Bloom A40 profiles; P2P power measured.",
)

_A100 = GPUSpec(
    gpu_type="A100-SXM",
    product_name="NVIDIA A100-SXM4-40GB",
    max_sm_clock_mhz=1410,
    min_sm_clock_mhz=210,
    memory_clocks_mhz=(1215,),
    min_power_limit_w=100.0,
    max_power_limit_w=400.0,
    default_power_limit_w=400.0,
    idle_power_w=55.0,
    p2p_block_power_w=83.64,
    static_power_w=110.0,
    dynamic_power_w=330.0,
    voltage_floor=0.726,
    knee_mhz=870.0,
    voltage_exponent=0.91,
    notes="A40 curve shape scaled to the A100 clock range and 400 W envelope; P2P power measured.",
)

_H100 = GPUSpec(
    gpu_type="H100-SXM",
    product_name="NVIDIA H100 80GB HBM3",
    max_sm_clock_mhz=1980,
    min_sm_clock_mhz=345,
    memory_clocks_mhz=(2619, 1593),
    min_power_limit_w=200.0,
    max_power_limit_w=700.0,
    default_power_limit_w=700.0,
    idle_power_w=70.0,
    p2p_block_power_w=119.0,
    static_power_w=180.0,
    dynamic_power_w=750.0,
    voltage_floor=0.726,
    knee_mhz=1225.0,
    voltage_exponent=0.91,
    notes=(
        "A40 curve shape scaled to the H100 clock range. Clocks, power limits, idle power, "
        "spin-kernel (P2P-blocking) power and the dynamic-power scale read on one real H100 "
        "(benchmarks/nvml_probe.py, 2026-11-22)."
    ),
)

GPU_SPECS: Mapping[str, GPUSpec] = MappingProxyType(
    {spec.gpu_type: spec for spec in (_A100, _A40, _H100)}
)
"""Read-only registry of emulated GPU types by name."""

_ALIASES = {"A100": "A100-SXM", "A100-SXM4": "A100-SXM", "H100": "H100-SXM"}


def gpu_type_names() -> list[str]:
    """Valid emulated GPU type names, sorted."""
    return sorted(GPU_SPECS)


def get_gpu_spec(gpu_type: str) -> GPUSpec:
    """Look up a GPU type by name (case-insensitive; "A100" and "H100" are accepted aliases)."""
    key = gpu_type.strip().upper()
    key = _ALIASES.get(key, key)
    if key not in GPU_SPECS:
        raise GPUValueError(
            f"Unknown emulated GPU type {gpu_type!r}; valid types: {', '.join(gpu_type_names())}"
        )
    return GPU_SPECS[key]
