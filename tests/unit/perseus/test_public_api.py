"""Each package's public surface: `__all__` is sorted and every name in it exists."""

from __future__ import annotations

import importlib

import pytest


@pytest.mark.parametrize(
    "package",
    [
        "perseus",
        "perseus.integrations",
        "perseus.integrations.pipelining",
        "perseus.planning",
        "perseus.profiles",
        "perseus.solver",
        "perseus.schedulers",
        "zeus_power",
        "zeus_power.device",
    ],
)
def test_all_is_sorted_and_importable(package: str) -> None:
    module = importlib.import_module(package)
    exported = list(module.__all__)
    assert exported == sorted(exported), f"{package}.__all__ is not sorted"
    missing = [name for name in exported if not hasattr(module, name)]
    assert not missing, f"{package}.__all__ names missing attributes: {missing}"


def test_the_front_door_is_attach() -> None:
    """README's first call is importable from the package itself."""
    import perseus
    from perseus.integrations.pipelining import attach

    assert "attach" in perseus.__all__ and perseus.attach is attach
