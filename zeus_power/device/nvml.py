"""Real NVIDIA GPUs through nvidia-ml-py (`pynvml`).

`pynvml` is imported inside the functions, so importing this module never needs a driver.
NVML errors become `GPUError`s in exactly one place, `_translate`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from zeus_power.device.base import (
    GPU,
    GPUError,
    GPUInitError,
    GPUNotSupportedError,
    GPUPermissionError,
    GPUValueError,
)

__all__ = ["NVMLGPU", "init_nvml", "open_nvml_gpus", "visible_nvml_indices"]

T = TypeVar("T")

_LOOKUPS = frozenset({"nvmlDeviceGetHandleByIndex", "nvmlDeviceGetCount", "nvmlDeviceGetUUID"})
"""NVML calls for which NOT_FOUND means the GPU itself is missing."""


def _translate(exc: Exception, gpu_index: int | None, what: str) -> GPUError:
    """Map one NVML error to the GPU error tree (the only place that does it)."""
    import pynvml

    code = getattr(exc, "value", None)
    detail = f"{what}: {exc}"
    if code == pynvml.NVML_ERROR_NO_PERMISSION:
        return GPUPermissionError(
            f"{detail}. This needs root (run with sudo) or the SYS_ADMIN capability "
            "(docker run --cap-add SYS_ADMIN)",
            gpu_index=gpu_index,
        )
    if code == pynvml.NVML_ERROR_NOT_SUPPORTED:
        return GPUNotSupportedError(f"{detail} (not supported by this GPU)", gpu_index=gpu_index)
    if code == pynvml.NVML_ERROR_INVALID_ARGUMENT:
        return GPUValueError(f"{detail} (a value outside the GPU's range)", gpu_index=gpu_index)
    if code == pynvml.NVML_ERROR_NOT_FOUND and what not in _LOOKUPS:
        # Seen on an H100 (driver 580): asking for the SM clocks of a memory clock the GPU
        # does not have answers NOT_FOUND, which is a bad value, not a missing driver.
        return GPUValueError(f"{detail} (no such value on this GPU)", gpu_index=gpu_index)
    init_codes = {
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_NOT_FOUND,
        pynvml.NVML_ERROR_GPU_IS_LOST,
    }
    if code in init_codes:
        return GPUInitError(
            f"{detail}. Is an NVIDIA driver installed and the GPU visible? "
            "Use ZEUS_GPU_BACKEND=emulated on machines without one",
            gpu_index=gpu_index,
        )
    return GPUError(detail, gpu_index=gpu_index)


@contextmanager
def _nvml(what: str, gpu_index: int | None = None) -> Iterator[None]:
    """Run an NVML call, translating its errors."""
    import pynvml

    try:
        yield
    except pynvml.NVMLError as exc:
        raise _translate(exc, gpu_index, what) from exc


def init_nvml() -> None:
    """Initialise NVML (reference-counted by the library); `GPUInitError` when there is no driver."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise GPUInitError(
            f"Could not initialise NVML: {exc}. Is an NVIDIA driver installed?"
        ) from exc  # `open_gpus` adds how to opt in to emulated GPUs


def visible_nvml_indices() -> list[int]:
    """NVML indices of the GPUs CUDA can see, in CUDA order (honours CUDA_VISIBLE_DEVICES).

    Needs NVML initialised. Entries may be indices or UUIDs (or UUID prefixes).
    """
    import pynvml

    with _nvml("nvmlDeviceGetCount"):
        count = pynvml.nvmlDeviceGetCount()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(range(count))
    uuids: list[str] | None = None
    indices: list[int] = []
    for entry in (e.strip() for e in visible.split(",")):
        if not entry:
            continue
        if entry.isdigit():
            index = int(entry)
        else:
            if uuids is None:
                with _nvml("nvmlDeviceGetUUID"):
                    uuids = [
                        _str(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)))
                        for i in range(count)
                    ]
            matches = [i for i, uuid in enumerate(uuids) if uuid.startswith(entry)]
            if len(matches) != 1:
                # CUDA stops at the first entry it cannot resolve.
                break
            index = matches[0]
        if index >= count:
            break
        indices.append(index)
    return indices


def _str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class NVMLGPU(GPU):
    """One real GPU. `index` is the CUDA-visible index; `nvml_index` the driver's."""

    def __init__(self, index: int, *, nvml_index: int | None = None) -> None:
        import pynvml

        super().__init__(index)
        self.nvml_index = index if nvml_index is None else nvml_index
        with _nvml("nvmlDeviceGetHandleByIndex", index):
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.nvml_index)

    def _call(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        with _nvml(what, self.index):
            return fn(self._handle, *args)

    def name(self) -> str:
        import pynvml

        return _str(self._call("nvmlDeviceGetName", pynvml.nvmlDeviceGetName))

    def supported_memory_clocks_mhz(self) -> list[int]:
        import pynvml

        clocks = self._call(
            "nvmlDeviceGetSupportedMemoryClocks", pynvml.nvmlDeviceGetSupportedMemoryClocks
        )
        return sorted((int(c) for c in clocks), reverse=True)

    def supported_sm_clocks_mhz(self, memory_clock_mhz: int | None = None) -> list[int]:
        import pynvml

        if memory_clock_mhz is None:
            memory_clock_mhz = self.supported_memory_clocks_mhz()[0]
        clocks = self._call(
            "nvmlDeviceGetSupportedGraphicsClocks",
            pynvml.nvmlDeviceGetSupportedGraphicsClocks,
            memory_clock_mhz,
        )
        return sorted((int(c) for c in clocks), reverse=True)

    def lock_sm_clocks(self, min_mhz: int, max_mhz: int) -> None:
        import pynvml

        if min_mhz > max_mhz:
            raise GPUValueError(
                f"lock_sm_clocks({min_mhz}, {max_mhz}): min_mhz exceeds max_mhz",
                gpu_index=self.index,
            )
        self._call(
            "nvmlDeviceSetGpuLockedClocks", pynvml.nvmlDeviceSetGpuLockedClocks, min_mhz, max_mhz
        )

    def reset_sm_clocks(self) -> None:
        import pynvml

        self._call("nvmlDeviceResetGpuLockedClocks", pynvml.nvmlDeviceResetGpuLockedClocks)

    def current_sm_clock_mhz(self) -> int:
        import pynvml

        return int(
            self._call("nvmlDeviceGetClockInfo", pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_SM)
        )

    def power_limit_constraints_mw(self) -> tuple[int, int]:
        import pynvml

        low, high = self._call(
            "nvmlDeviceGetPowerManagementLimitConstraints",
            pynvml.nvmlDeviceGetPowerManagementLimitConstraints,
        )
        return int(low), int(high)

    def default_power_limit_mw(self) -> int:
        import pynvml

        return int(
            self._call(
                "nvmlDeviceGetPowerManagementDefaultLimit",
                pynvml.nvmlDeviceGetPowerManagementDefaultLimit,
            )
        )

    def get_power_limit_mw(self) -> int:
        import pynvml

        return int(
            self._call(
                "nvmlDeviceGetPowerManagementLimit", pynvml.nvmlDeviceGetPowerManagementLimit
            )
        )

    def set_power_limit_mw(self, limit_mw: int) -> None:
        import pynvml

        low, high = self.power_limit_constraints_mw()
        if not low <= limit_mw <= high:
            raise GPUValueError(
                f"Power limit {limit_mw} mW is outside the supported range {low}..{high} mW",
                gpu_index=self.index,
            )
        self._call(
            "nvmlDeviceSetPowerManagementLimit", pynvml.nvmlDeviceSetPowerManagementLimit, limit_mw
        )

    def supports_energy_counter(self) -> bool:
        import pynvml

        try:
            arch = self._call("nvmlDeviceGetArchitecture", pynvml.nvmlDeviceGetArchitecture)
        except GPUError:
            arch = None
        if arch is not None:
            return int(arch) >= pynvml.NVML_DEVICE_ARCH_VOLTA
        try:
            self.total_energy_mj()
        except GPUNotSupportedError:
            return False
        return True

    def total_energy_mj(self) -> int:
        import pynvml

        return int(
            self._call(
                "nvmlDeviceGetTotalEnergyConsumption", pynvml.nvmlDeviceGetTotalEnergyConsumption
            )
        )

    def power_usage_mw(self) -> int:
        import pynvml

        return int(self._call("nvmlDeviceGetPowerUsage", pynvml.nvmlDeviceGetPowerUsage))


def open_nvml_gpus(indices: list[int] | None = None) -> list[NVMLGPU]:
    """Initialise NVML and open the CUDA-visible GPUs at `indices` (default: all visible)."""
    init_nvml()
    visible = visible_nvml_indices()
    if not visible:
        raise GPUInitError("NVML found no visible GPUs (check CUDA_VISIBLE_DEVICES)")
    wanted = list(range(len(visible))) if indices is None else list(indices)
    for index in wanted:
        if not 0 <= index < len(visible):
            raise GPUInitError(
                f"GPU index {index} is out of range; {len(visible)} GPU(s) visible "
                f"(valid indices 0..{len(visible) - 1})"
            )
    return [NVMLGPU(index, nvml_index=visible[index]) for index in wanted]
