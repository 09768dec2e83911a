"""`open_gpus`: backend choice from arguments and environment, NVML without a driver."""

from __future__ import annotations

import importlib.util

import pytest

import zeus_power.device as device
from zeus_power.device import open_gpus
from zeus_power.device.base import GPUInitError, GPUValueError
from zeus_power.device.emulated import EmulatedGPU, VirtualClock, Workload


def _nvml_available() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    return True


requires_no_driver = pytest.mark.skipif(
    importlib.util.find_spec("pynvml") is None or _nvml_available(),
    reason="an NVIDIA driver is present",
)


def test_exports_are_sorted_and_importable():
    assert device.__all__ == sorted(device.__all__)
    for name in device.__all__:
        assert getattr(device, name) is not None


def test_emulated_defaults():
    gpus = open_gpus(backend="emulated")
    assert len(gpus) == 1 and isinstance(gpus[0], EmulatedGPU)
    assert gpus[0].spec.gpu_type == "A100-SXM" and gpus[0].index == 0


def test_emulated_from_environment(monkeypatch):
    monkeypatch.setenv("ZEUS_GPU_BACKEND", "emulated")
    monkeypatch.setenv("ZEUS_EMULATED_GPU", "A40")
    monkeypatch.setenv("ZEUS_EMULATED_GPU_COUNT", "4")
    gpus = open_gpus()
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert {g.name() for g in gpus} == {"NVIDIA A40 (emulated)"}
    assert [g.index for g in open_gpus([2, 3])] == [2, 3]
    with pytest.raises(GPUInitError, match=r"index 4 .*ZEUS_EMULATED_GPU_COUNT=4"):
        open_gpus([4])


def test_indices_without_count_and_shared_clock():
    clock = VirtualClock()
    gpus = open_gpus([5, 7], backend="emulated", gpu_type="H100-SXM", clock=clock)
    assert [g.index for g in gpus] == [5, 7]
    gpus[0].execute(Workload(1.0))
    assert gpus[1].clock() == clock() >= 1.0  # both GPUs read the one clock
    with pytest.raises(GPUValueError, match="duplicates"):
        open_gpus([1, 1], backend="emulated")


def test_seeded_noise_differs_per_gpu_and_repeats():
    def times(seed):
        gpus = open_gpus([0, 1], backend="emulated", clock=VirtualClock(), seed=seed, noise=0.05)
        return [g.execute(Workload(1.0)).time_s for g in gpus]

    first = times(3)
    assert first == times(3) and first[0] != first[1]


def test_unknown_names_list_the_valid_ones(monkeypatch):
    with pytest.raises(GPUValueError, match="valid backends: auto, emulated, nvml"):
        open_gpus(backend="cuda")
    with pytest.raises(GPUValueError, match="valid types: A100-SXM, A40, H100-SXM"):
        open_gpus(backend="emulated", gpu_type="TPU")
    monkeypatch.setenv("ZEUS_GPU_BACKEND", "rocm")
    with pytest.raises(GPUValueError, match="ZEUS_GPU_BACKEND"):
        open_gpus()
    monkeypatch.setenv("ZEUS_GPU_BACKEND", "emulated")
    monkeypatch.setenv("ZEUS_EMULATED_GPU_COUNT", "0")
    with pytest.raises(GPUValueError, match="ZEUS_EMULATED_GPU_COUNT"):
        open_gpus()


@requires_no_driver
def test_nvml_without_driver_is_a_clear_init_error():
    with pytest.raises(GPUInitError, match=r"NVML.*ZEUS_GPU_BACKEND=emulated"):
        open_gpus(backend="nvml")


def test_auto_without_driver_or_opt_in_is_an_error_naming_the_opt_in(no_driver_no_opt_in):
    """No silent fallback: `auto` (the default) with no driver refuses, naming the opt-in."""
    for call in (lambda: open_gpus([0]), lambda: open_gpus([0], backend="auto")):
        with pytest.raises(GPUInitError, match=r"never emulates.*ZEUS_GPU_BACKEND=emulated"):
            call()


def test_opting_in_gives_gpus_that_say_they_are_emulated(monkeypatch):
    monkeypatch.setenv("ZEUS_GPU_BACKEND", "emulated")
    monkeypatch.setenv("ZEUS_EMULATED_GPU", "A40")
    gpus = open_gpus([0, 1])
    assert all(isinstance(g, EmulatedGPU) and g.spec.gpu_type == "A40" for g in gpus)
    assert all(g.emulated for g in gpus)
    assert [g.emulated for g in open_gpus([0], backend="emulated")] == [True]
