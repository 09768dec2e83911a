"""`perseus` does not import `schedulers`, except the coordinator and the CLI that starts it
(the schedulers import `perseus`; anything else would be a cycle)."""

from __future__ import annotations

import ast
from pathlib import Path

import perseus

ALLOWED = ("server", "cli")


def test_perseus_imports_schedulers_only_in_the_server_and_cli() -> None:
    root = Path(perseus.__file__).parent
    offenders = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).parts[0] in ALLOWED:
            continue
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            if any(n == "schedulers" or n.startswith("schedulers.") for n in names):
                offenders.append(f"{path.relative_to(root)}:{node.lineno}")
        if 'import_module("schedulers' in text or "import_module('schedulers" in text:
            offenders.append(f"{path.relative_to(root)}: import_module")
    assert not offenders, f"perseus modules importing schedulers: {offenders}"
