"""Which GPU a profile was measured on, and the blocking power to plan with.

A profile's SM clocks identify an emulated GPU type (`zeus_power.device.specs`) when its top
clock is that type's maximum and every clock is one the type supports. The default blocking
power is then that spec's measured P2P-blocking power; for an unknown GPU it is
`DEFAULT_P2P_POWER_W` (the A40's). A given blocking power must lie in the GPU's power range
(1 W to its board maximum), or in the plausible range 1 W to 2 kW for an unknown GPU; both
times the GPUs per stage (tensor parallelism) for a stage's blocking power.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from perseus.domain.kinds import DEFAULT_P2P_POWER_W, MAX_PLAUSIBLE_POWER_W, MIN_PLAUSIBLE_POWER_W
from perseus.domain.units import blocking_power_problem
from perseus.errors import ConfigurationError

if TYPE_CHECKING:
    from perseus.domain.profile import InstructionProfile
    from zeus_power.device.specs import GPUSpec

__all__ = ["BlockingPower", "blocking_power", "gpu_of_profile", "named_gpu"]


def named_gpu(name: str) -> GPUSpec:
    """The spec of a GPU named on the command line (`ConfigurationError` if unknown)."""
    from zeus_power.device.base import GPUValueError
    from zeus_power.device.specs import get_gpu_spec

    try:
        return get_gpu_spec(name)
    except GPUValueError as exc:
        raise ConfigurationError(str(exc)) from None


def gpu_of_profile(profile: InstructionProfile) -> GPUSpec | None:
    """The emulated GPU type whose clocks the profile's match, or None."""
    from zeus_power.device.specs import GPU_SPECS

    freqs = profile.frequencies()
    for spec in GPU_SPECS.values():
        if freqs[0] == spec.max_sm_clock_mhz and set(freqs) <= set(spec.supported_sm_clocks_mhz()):
            return spec
    return None


@dataclass(frozen=True)
class BlockingPower:
    """The blocking power to plan with, and why it is that one."""

    watts: float
    reason: str

    def describe(self) -> str:
        return f"{self.watts:g} W: {self.reason}"


def blocking_power(
    profile: InstructionProfile,
    given_w: float | None = None,
    *,
    gpu: str | None = None,
    option: str = "--p2p-power",
) -> BlockingPower:
    """The given blocking power (checked against the GPU's range), or the GPU's default.

    The GPU is `gpu` when named, else the one the profile's clocks match, else unknown.
    Raises `ConfigurationError` for a given power outside the GPU's range, with a hint.
    """
    spec = named_gpu(gpu) if gpu is not None else gpu_of_profile(profile)
    if given_w is not None:
        n = profile.gpus_per_stage  # a tensor-parallel stage blocks n GPUs at once
        if spec is not None:
            high, name = spec.max_power_w * n, spec.gpu_type
        else:
            high, name = MAX_PLAUSIBLE_POWER_W * n, "a GPU"
        if n > 1:
            name = f"{n} x {name} (a stage's GPUs)"
        low = MIN_PLAUSIBLE_POWER_W
        problem = blocking_power_problem(given_w, low, high, gpu=name, name=option)
        if problem:
            raise ConfigurationError(problem)
        return BlockingPower(float(given_w), option)
    if spec is None:
        return BlockingPower(
            DEFAULT_P2P_POWER_W,
            "the A40's measured blocking power (the profile's clocks match no known GPU; "
            "pass --gpu or --p2p-power)",
        )
    source = (
        f"--gpu {spec.gpu_type}" if gpu is not None else f"profile clocks match the {spec.gpu_type}"
    )
    return BlockingPower(spec.p2p_block_power_w, f"the {spec.gpu_type} spec's ({source})")
