"""One error tree: every exception class defined anywhere in `zeus_power` is a `ZeusError`."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import warnings

import pytest

import zeus_power
from zeus_power.device.base import GPUError, GPUInitError, GPUValueError
from zeus_power.errors import ZeusConfigError, ZeusError
from zeus_power.power_limit import ShortEpochWarning


def _exception_classes() -> dict[str, type[BaseException]]:
    """Every BaseException subclass defined (not imported) in a module of `zeus_power`."""

    def fail(name: str) -> None:
        raise ImportError(f"cannot import {name}")

    found: dict[str, type[BaseException]] = {}
    names = ["zeus_power"] + [
        info.name for info in pkgutil.walk_packages(zeus_power.__path__, "zeus_power.", fail)
    ]
    for name in names:
        module = importlib.import_module(name)
        for obj in vars(module).values():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__ == module.__name__
            ):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return found


def test_every_exception_class_of_the_package_derives_from_zeus_error() -> None:
    classes = _exception_classes()
    # The walk must see the classes outside zeus_power.errors too, or it proves nothing.
    assert "zeus_power.device.base.GPUError" in classes
    assert "zeus_power.power_limit.states.ShortEpochWarning" in classes
    assert "zeus_power.errors.ZeusCostThresholdExceededError" in classes
    outside = sorted(name for name, cls in classes.items() if not issubclass(cls, ZeusError))
    assert not outside, f"exception classes outside the ZeusError tree: {outside}"


def test_the_device_errors_keep_their_other_bases() -> None:
    assert issubclass(GPUError, ZeusError) and issubclass(GPUError, Exception)
    assert issubclass(GPUValueError, GPUError) and issubclass(GPUValueError, ValueError)
    assert issubclass(ZeusConfigError, ValueError)
    err = GPUInitError("no driver", gpu_index=3)
    assert isinstance(err, ZeusError) and err.gpu_index == 3 and str(err) == "GPU 3: no driver"


def test_short_epoch_warning_is_still_a_runtime_warning() -> None:
    assert issubclass(ShortEpochWarning, RuntimeWarning)
    with pytest.warns(RuntimeWarning):
        warnings.warn("short", ShortEpochWarning, stacklevel=1)
