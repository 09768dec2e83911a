"""The NVML backend without a GPU: lazy import, error translation, clear failures.

The backend's calls themselves need a driver and a GPU; CI has neither, so
these tests cover what runs without one, using real `pynvml` error objects (no mocks).
"""

from __future__ import annotations

import subprocess
import sys

import pynvml
import pytest

from zeus_power.device.base import (
    GPUError,
    GPUInitError,
    GPUNotSupportedError,
    GPUPermissionError,
    GPUValueError,
)
from zeus_power.device.nvml import NVMLGPU, _nvml, _translate


def _driver_present() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    return True


def test_importing_the_device_layer_does_not_load_pynvml():
    code = "import sys, zeus_power.device, zeus_power.device.nvml; print('pynvml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("code", "error", "match"),
    [
        (
            pynvml.NVML_ERROR_NO_PERMISSION,
            GPUPermissionError,
            r"GPU 2: .*sudo.*--cap-add SYS_ADMIN",
        ),
        (pynvml.NVML_ERROR_NOT_SUPPORTED, GPUNotSupportedError, "not supported"),
        (pynvml.NVML_ERROR_INVALID_ARGUMENT, GPUValueError, "outside the GPU's range"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, GPUInitError, "ZEUS_GPU_BACKEND=emulated"),
        (pynvml.NVML_ERROR_UNINITIALIZED, GPUInitError, "driver"),
        (pynvml.NVML_ERROR_TIMEOUT, GPUError, "nvmlDeviceSetGpuLockedClocks"),
    ],
)
def test_nvml_errors_map_onto_the_gpu_error_tree(code, error, match):
    exc = pynvml.NVMLError(code)
    translated = _translate(exc, 2, "nvmlDeviceSetGpuLockedClocks")
    assert type(translated) is error
    assert translated.gpu_index == 2
    with pytest.raises(error, match=match) as info, _nvml("nvmlDeviceSetGpuLockedClocks", 2):
        raise exc
    assert info.value.__cause__ is exc


def test_not_found_is_a_bad_value_except_when_looking_up_the_gpu():
    # On a real H100, nvmlDeviceGetSupportedGraphicsClocks(handle, 1) answers NOT_FOUND.
    exc = pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
    bad_value = _translate(exc, 0, "nvmlDeviceGetSupportedGraphicsClocks")
    assert type(bad_value) is GPUValueError
    assert "no such value" in str(bad_value) and "driver" not in str(bad_value)
    missing_gpu = _translate(exc, 3, "nvmlDeviceGetHandleByIndex")
    assert type(missing_gpu) is GPUInitError


@pytest.mark.skipif(_driver_present(), reason="an NVIDIA driver is present")
def test_handle_without_driver_is_an_init_error():
    with pytest.raises(GPUInitError, match="GPU 0: nvmlDeviceGetHandleByIndex"):
        NVMLGPU(0)
