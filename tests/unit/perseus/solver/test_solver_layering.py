"""The solver is generic: it imports numpy, scipy, the standard library and `perseus.errors`
only (no domain, files, wire models, settings, server, client, planning or schedulers)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import perseus.solver

SOLVER = Path(perseus.solver.__file__).parent
ALLOWED_PERSEUS = ("perseus.errors", "perseus.solver")


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def test_solver_imports_only_numpy_scipy_stdlib_and_errors() -> None:
    files = sorted(SOLVER.glob("*.py"))
    assert files
    for path in files:
        for name in _imports(path):
            top = name.split(".")[0]
            if top == "perseus":
                assert name.startswith(ALLOWED_PERSEUS), f"{path.name} imports {name}"
            else:
                assert top in {"numpy", "scipy", "__future__"} or top in sys.stdlib_module_names, (
                    f"{path.name} imports {name}"
                )
