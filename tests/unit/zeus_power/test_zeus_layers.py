"""The package's shape: one-way layers, the lazy top level, one class per name.

The import checks run in a fresh interpreter, since this one has imported everything already.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import pkgutil
import subprocess
import sys

import pytest
from paths import REPO

import zeus_power

HEAVY = frozenset(
    {
        "fastapi",
        "httpx",
        "matplotlib",
        "rich",
        "sqlalchemy",
        "starlette",
        "torch",
        "typer",
        "uvicorn",
    }
)
"""Top-level packages that no light import of `zeus_power` may load."""


def _modules_after(statement: str) -> set[str]:
    """The modules loaded by `statement` in a fresh interpreter run from this checkout."""
    code = f"import json, sys; {statement}; print(json.dumps(sorted(sys.modules)))"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, check=True
    )
    return set(json.loads(result.stdout))


def _ours(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m == "zeus_power" or m.startswith("zeus_power."))


def _heavy(modules: set[str]) -> list[str]:
    return sorted({m.split(".")[0] for m in modules} & HEAVY)


def test_importing_the_package_loads_no_submodule_and_nothing_heavy() -> None:
    modules = _modules_after("import zeus_power")
    assert _ours(modules) == ["zeus_power"]
    assert _heavy(modules) == []


def test_the_errors_module_imports_nothing_of_the_package() -> None:
    modules = _modules_after("import zeus_power.errors")
    assert _ours(modules) == ["zeus_power", "zeus_power.errors"]


def test_the_device_layer_imports_only_itself_and_the_errors() -> None:
    modules = _modules_after("from zeus_power.device import open_gpus")
    outside = [
        m for m in _ours(modules) if not m.startswith("zeus_power.device") and m != "zeus_power"
    ]
    assert outside == ["zeus_power.errors"]
    assert _heavy(modules) == []


def test_a_gpu_spec_costs_neither_the_emulator_nor_the_settings() -> None:
    """`perseus solve` reads a GPU's spec (its blocking power): that alone must not load
    the emulator or pydantic-settings (the package hands its names out lazily)."""
    modules = _modules_after("from zeus_power.device.specs import get_gpu_spec")
    assert "zeus_power.device.emulated" not in modules
    assert "zeus_power.device.factory" not in modules
    assert "pydantic_settings" not in modules
    # Every name the package exports still comes from the module it lives in.
    modules = _modules_after("import zeus_power.device as d; [getattr(d, n) for n in d.__all__]")
    assert "zeus_power.device.factory" in modules and "pydantic_settings" in modules


def test_the_monitor_needs_no_batch_size_optimizer() -> None:
    modules = _modules_after("import zeus_power.monitor")
    assert not [m for m in _ours(modules) if m.startswith(("zeus_power.bso", "zeus_power.master"))]
    assert _heavy(modules) == []


def test_a_training_script_can_import_its_side_of_the_protocol_alone() -> None:
    modules = _modules_after("import zeus_power.training")
    assert _ours(modules) == ["zeus_power", "zeus_power.errors", "zeus_power.training"]


def test_every_public_name_resolves_to_its_module() -> None:
    for name in zeus_power.__all__:
        value = getattr(zeus_power, name)
        module = sys.modules[zeus_power._EXPORTS[name]]
        assert value is getattr(module, name), name
    assert set(zeus_power.__all__) <= set(dir(zeus_power))
    assert zeus_power.monitor is sys.modules["zeus_power.monitor"]


def test_unknown_attributes_still_raise_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = zeus_power.nope
    assert not hasattr(zeus_power, "ZeusBSOTrialNotFound")


def test_star_import_gives_all_of_all() -> None:
    namespace: dict[str, object] = {}
    exec("from zeus_power import *", namespace)
    assert set(zeus_power.__all__) <= set(namespace)


def test_no_two_classes_of_the_package_share_a_name() -> None:
    classes: dict[str, set[type]] = {}
    for info in pkgutil.walk_packages(zeus_power.__path__, "zeus_power."):
        module = importlib.import_module(info.name)
        for obj in vars(module).values():
            if inspect.isclass(obj) and obj.__module__ == module.__name__:
                classes.setdefault(obj.__qualname__, set()).add(obj)
    assert "EmulatedGPU" in classes  # the walk saw the package
    shared = {
        name: sorted(cls.__module__ for cls in found)
        for name, found in classes.items()
        if len(found) > 1
    }
    assert not shared, f"class names defined in more than one module: {shared}"
