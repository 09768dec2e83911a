"""The shape the README claims: cheap imports and no import cycles.

The import-linter contracts in `pyproject.toml` (run by `lint-imports` in the test command)
check the layers; these tests check what they cannot: what an import really loads at run
time, and cycles that go through `importlib.import_module("name")`, which static import
graphs miss.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import grimp
import networkx as nx
import pytest
from paths import REPO

ROOTS = ("perseus", "zeus_power")
HEAVY = (
    "httpx",
    "fastapi",
    "uvicorn",
    "starlette",
    "matplotlib",
    "torch",
    "sqlalchemy",
    "typer",
    "rich",
)


@pytest.mark.parametrize("module", ["perseus", "perseus.solver", "zeus_power", "zeus_power.device"])
def test_import_loads_no_heavy_library(module: str) -> None:
    code = (
        f"import json, sys, {module}; "
        f"print(json.dumps(sorted(m for m in {list(HEAVY)!r} if m in sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert json.loads(out.stdout) == [], f"`import {module}` loaded {out.stdout.strip()}"


def test_a_solve_loads_neither_pandas_nor_networkx() -> None:
    """`perseus solve` reads a profile from CSV rows, builds and sorts the schedule and
    solves without the two (0.3 s of a small solve's start-up between them)."""
    code = (
        "import json, sys\n"
        "from perseus.io.profile_csv import load_profile\n"
        "from perseus.domain.schedule import make_schedule\n"
        "from perseus.planning import solve_frontier\n"
        "profile = load_profile('perseus/profiles/bloom_a40_8stage.csv')\n"
        "solve_frontier(profile, make_schedule('1f1b', 8, 2), p2p_power_w=70.0, max_points=4)\n"
        "print(json.dumps(sorted(m for m in ('pandas', 'networkx') if m in sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert json.loads(out.stdout) == []


def _is_module(base: Path, dotted: str) -> bool:
    path = base.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _dynamic_imports(base: Path = REPO) -> list[tuple[str, str]]:
    """(importer, imported) for the modules a file may load with `import_module`.

    A literal argument names its module. A computed one (a lazy ``__init__`` that maps
    names to modules) may load any module of the project that a string in the file names,
    absolutely (``"perseus.errors"``) or relative to the package (``"problem"``).
    """
    edges = []
    for root in ROOTS:
        for path in sorted((base / root).rglob("*.py")):
            rel = path.relative_to(base).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            importer = ".".join(parts)
            tree = ast.parse(path.read_text(), str(path))
            computed = False
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call) or not node.args:
                    continue
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name not in ("import_module", "__import__"):
                    continue
                arg = node.args[0]
                if isinstance(arg, ast.Constant):
                    if str(arg.value).split(".")[0] in ROOTS:
                        edges.append((importer, str(arg.value)))
                else:
                    computed = True
            if not computed:
                continue
            strings = {
                n.value
                for n in ast.walk(tree)
                if isinstance(n, ast.Constant) and isinstance(n.value, str)
            }
            for value in sorted(strings):
                for candidate in (value, f"{importer}.{value}"):
                    if (
                        candidate != importer
                        and candidate.split(".")[0] in ROOTS
                        and all(part.isidentifier() for part in candidate.split("."))
                        and _is_module(base, candidate)
                    ):
                        edges.append((importer, candidate))
    return edges


def test_no_import_cycle_between_modules() -> None:
    graph = grimp.build_graph(*ROOTS)
    deps = nx.DiGraph()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            deps.add_edge(module, imported)
    deps.add_edges_from(_dynamic_imports())
    cycles = [sorted(c) for c in nx.strongly_connected_components(deps) if len(c) > 1]
    assert not cycles, f"import cycles: {cycles}"


def test_dynamic_import_scan_sees_literal_and_mapped_names(tmp_path: Path) -> None:
    """The scan finds `import_module("pkg")` and the modules a lazy map may load."""
    pkg = tmp_path / "perseus"
    (pkg / "solver").mkdir(parents=True)
    (pkg / "solver" / "problem.py").write_text("")
    (pkg / "settings.py").write_text(
        'import importlib\nregistry = importlib.import_module("perseus.schedulers").SCHEDULERS\n'
    )
    (pkg / "solver" / "__init__.py").write_text(
        'import importlib\n_WHERE = {"SolverProblem": "problem"}\n'
        "def __getattr__(name):\n"
        '    return importlib.import_module(f"{__name__}.{_WHERE[name]}")\n'
    )
    (pkg / "__init__.py").write_text(
        'import importlib\n_SOURCES = {"X": "perseus.settings", "Y": "numpy"}\n'
        "def __getattr__(name):\n    return importlib.import_module(_SOURCES[name])\n"
    )
    assert sorted(_dynamic_imports(tmp_path)) == [
        ("perseus", "perseus.settings"),
        ("perseus.settings", "perseus.schedulers"),
        ("perseus.solver", "perseus.solver.problem"),
    ]


def _classes_by_name(base: Path = REPO) -> dict[str, list[str]]:
    """Class name → the modules that define a class of that name (top level or nested)."""
    found: dict[str, list[str]] = {}
    for root in ROOTS:
        for path in sorted((base / root).rglob("*.py")):
            module = ".".join(path.relative_to(base).with_suffix("").parts)
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef):
                    found.setdefault(node.name, []).append(module)
    return found


def test_no_two_classes_share_a_name() -> None:
    shared = {name: where for name, where in _classes_by_name().items() if len(where) > 1}
    assert not shared, f"class names defined more than once: {shared}"


MAX_MODULES_SIDE_BY_SIDE = 20
"""Issue 50: a folder where a concept has parts; no folder of the product holds more
modules than this side by side (``__init__.py`` counts)."""


def test_no_product_folder_has_more_than_twenty_modules_side_by_side() -> None:
    crowded = {
        str(folder.relative_to(REPO)): n
        for root in ROOTS
        for folder in [REPO / root, *(REPO / root).rglob("*")]
        if folder.is_dir()
        and folder.name != "__pycache__"
        and (n := len(list(folder.glob("*.py")))) > MAX_MODULES_SIDE_BY_SIDE
    }
    assert not crowded, f"folders with more than {MAX_MODULES_SIDE_BY_SIDE} modules: {crowded}"

