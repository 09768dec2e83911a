"""The one GPU interface every other module talks to.

Two implementations live beside this module: `nvml.NVMLGPU` (real NVIDIA GPUs through
nvidia-ml-py) and `emulated.EmulatedGPU` (a DVFS model, for machines without a GPU and for
tests). Units are in the names: clocks in MHz, power in mW, energy in mJ, as NVML reports
them; conversion to W and J happens in the callers that do arithmetic.

```
ZeusError                   (zeus_power.errors: the root of the whole package)
└── GPUError
    ├── GPUNotSupportedError    the operation is not supported by this GPU / backend
    ├── GPUPermissionError      needs root or SYS_ADMIN (locking clocks, setting power limits)
    ├── GPUValueError           a clock or power value outside the device's range; a ValueError
    └── GPUInitError            the backend could not be initialised (no driver, bad index)
```
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pydantic import ValidationError

from zeus_power.errors import ZeusError

if TYPE_CHECKING:  # pydantic-settings costs 25 ms to import: only the settings need it
    from pydantic_settings import BaseSettings

__all__ = [
    "GPU",
    "GPUError",
    "GPUInitError",
    "GPUNotSupportedError",
    "GPUPermissionError",
    "GPUValueError",
    "StandIn",
]


class GPUError(ZeusError):
    """Root of the device layer's errors. Carries the GPU index when known."""

    def __init__(self, message: str, *, gpu_index: int | None = None):
        if gpu_index is not None:
            message = f"GPU {gpu_index}: {message}"
        super().__init__(message)
        self.gpu_index = gpu_index


class GPUNotSupportedError(GPUError):
    """The GPU or backend does not support the operation."""


class GPUPermissionError(GPUError):
    """The operation needs more privileges (root or CAP_SYS_ADMIN)."""


class GPUValueError(GPUError, ValueError):
    """A requested clock or power value is outside what the GPU supports."""


class GPUInitError(GPUError):
    """The backend could not be initialised."""


class StandIn(Protocol):
    """What a GPU that runs no kernels itself offers the process that works in its stead.

    A real GPU slows its kernels down by itself when a lower clock is locked and its energy
    counter measures them. An emulated one does neither: the calling process does the work,
    stretches it to the locked clock with `stretch_factor`, and charges the model's
    `busy_power_w` to the energy drawn with `begin_busy`/`end_busy` (or `record_busy` after
    the fact), which the GPU's sensors then show as a real GPU's would. `workload` is whatever the
    GPU's model accepts (for `EmulatedGPU`, a `Workload` or a memory fraction).
    """

    def current_sm_clock_mhz(self) -> int:
        """The SM clock in force."""
        ...

    def target_sm_clock_mhz(self) -> int:
        """The newest SM clock asked for (in force once its switch completes)."""
        ...

    def get_power_limit_mw(self) -> int:
        """The power limit in force, in mW (the model's answers depend on it)."""
        ...

    def stretch_factor(self, workload: Any, freq_mhz: float | None = None) -> float:
        """Time at `freq_mhz` (default: the clock in force) over time at the max clock."""
        ...

    def busy_power_w(self, workload: Any, freq_mhz: float | None = None) -> float:
        """Power while running `workload` at `freq_mhz` (default: the clock in force)."""
        ...

    def record_busy(self, duration_s: float, power_w: float) -> None:
        """Add `duration_s` of work at `power_w`, just finished, to the energy counter."""
        ...

    def begin_busy(self, power_w: float) -> None:
        """Work at `power_w` starts now: a refreshing counter sees it while it runs."""
        ...

    def end_busy(self, duration_s: float, energy_j: float) -> None:
        """The work `begin_busy` started lasted `duration_s` and drew `energy_j` in all."""
        ...

    def switch_lag(self, ago_s: float = 0.0) -> tuple[int, float]:
        """(clock in force `ago_s` seconds ago, seconds from then until the newest clock
        asked for takes effect; 0 when already in force): a clock switch takes time."""
        ...


class GPU(abc.ABC):
    """One GPU. Instances are cheap handles; make them with `zeus_power.device.open_gpus`."""

    def __init__(self, index: int) -> None:
        self.index = index

    @abc.abstractmethod
    def name(self) -> str:
        """Product name, e.g. "NVIDIA A40"."""

    @abc.abstractmethod
    def supported_memory_clocks_mhz(self) -> list[int]:
        """Supported memory clocks, descending."""

    @abc.abstractmethod
    def supported_sm_clocks_mhz(self, memory_clock_mhz: int | None = None) -> list[int]:
        """Supported SM (graphics) clocks for a memory clock (default: the highest), descending."""

    @abc.abstractmethod
    def lock_sm_clocks(self, min_mhz: int, max_mhz: int) -> None:
        """Lock the SM clock into [min_mhz, max_mhz]. Equal bounds pin one frequency."""

    @abc.abstractmethod
    def reset_sm_clocks(self) -> None:
        """Undo `lock_sm_clocks`."""

    @abc.abstractmethod
    def power_limit_constraints_mw(self) -> tuple[int, int]:
        """(min, max) settable power limit in mW."""

    @abc.abstractmethod
    def default_power_limit_mw(self) -> int:
        """The default (factory) power limit in mW."""

    @abc.abstractmethod
    def get_power_limit_mw(self) -> int:
        """The power limit in force, in mW."""

    @abc.abstractmethod
    def set_power_limit_mw(self, limit_mw: int) -> None:
        """Set the power limit in mW; `GPUValueError` outside the constraints."""

    @abc.abstractmethod
    def supports_energy_counter(self) -> bool:
        """Whether `total_energy_mj` is available (Volta and newer on NVML)."""

    @abc.abstractmethod
    def total_energy_mj(self) -> int:
        """Monotone energy counter in mJ since an arbitrary origin (driver load)."""

    @abc.abstractmethod
    def power_usage_mw(self) -> int:
        """Instantaneous power draw in mW (for GPUs without an energy counter)."""

    def current_sm_clock_mhz(self) -> int:
        """The SM clock the GPU runs at now, as the driver reports it (a locked clock shows
        here once its switch has completed). `GPUNotSupportedError` where it cannot be read."""
        raise GPUNotSupportedError(
            f"{type(self).__name__} cannot report its current SM clock", gpu_index=self.index
        )

    @property
    def stand_in(self) -> StandIn | None:
        """How to emulate this GPU's work when it runs none itself; None on real GPUs.

        Real GPUs slow their kernels down by themselves under a locked clock, so callers
        have nothing to emulate; an emulated GPU returns the model the caller needs.
        """
        return None

    @property
    def emulated(self) -> bool:
        """Whether this GPU is emulated: its times and energies come from a model, not a
        measurement. Everything made on one (measurements, profiles, plans) says so."""
        return False

    def __repr__(self) -> str:
        return f"{type(self).__name__}(index={self.index})"


_S = TypeVar("_S", bound="BaseSettings")


def load_env_settings(settings_cls: type[_S], what: str) -> _S:
    """`settings_cls()` read from the environment; `GPUValueError` naming each bad variable
    (``{env_prefix}{FIELD}``) and never echoing more than pydantic's message."""
    prefix = str(settings_cls.model_config.get("env_prefix", ""))
    try:
        return settings_cls()
    except ValidationError as exc:
        problems = "; ".join(
            f"{prefix}{'_'.join(str(p) for p in err['loc']).upper()}: {err['msg']}"
            for err in exc.errors()
        )
        raise GPUValueError(f"Invalid {what} settings in the environment: {problems}") from exc
