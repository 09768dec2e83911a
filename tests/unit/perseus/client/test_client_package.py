"""The client package's shape: lazy exports, its layering, and the GPU capability it uses."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import perseus.client
from perseus.client.settings import ClientSettings
from perseus.client.trace import TRACE_DIR_ENV, Trace
from zeus_power.device.base import GPU
from zeus_power.device.emulated import EmulatedGPU

CLIENT = Path(perseus.client.__file__).parent
ALLOWED = ("perseus.client", "perseus.protocol", "perseus.errors", "zeus_power.device")
FORBIDDEN = (
    "perseus.solver",
    "perseus.planning",
    "perseus.server",
    "perseus.cli",
    "perseus.demo",
    "perseus.schedulers",
    "torch",
    "fastapi",
    "pandas",
    "networkx",
)


def _first_party_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return {n for n in names if n.split(".")[0] in ("perseus", "zeus_power", "perseus.schedulers")}


@pytest.mark.parametrize("module", sorted(str(p.relative_to(CLIENT)) for p in CLIENT.rglob("*.py")))
def test_the_client_imports_only_the_protocol_the_errors_and_the_device_layer(module):
    bad = [
        name
        for name in _first_party_imports(CLIENT / module)
        if not any(name == ok or name.startswith(ok + ".") for ok in ALLOWED)
    ]
    assert not bad, f"perseus/client/{module} imports {bad}"


def test_importing_the_hook_loads_neither_the_solver_nor_the_server_nor_heavy_libraries():
    code = (
        "import json, sys, perseus.client.hook; print(json.dumps(sorted(m for m in sys.modules)))"
    )
    loaded = json.loads(
        subprocess.run(
            [sys.executable, "-c", code], check=True, capture_output=True, text=True
        ).stdout
    )
    hits = [m for m in loaded if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)]
    assert not hits


def test_exports_are_sorted_complete_and_resolved_on_demand():
    assert perseus.client.__all__ == sorted(perseus.client.__all__)
    for name in perseus.client.__all__:
        assert getattr(perseus.client, name) is not None
    assert set(perseus.client.__all__) <= set(dir(perseus.client))
    assert perseus.client.PerseusOptimizer.__module__ == "perseus.client.hook"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = perseus.client.nope


def test_the_hook_asks_the_gpu_for_a_stand_in_instead_of_its_class():
    gpu = EmulatedGPU(0)
    assert gpu.stand_in is gpu
    from zeus_power.device.nvml import NVMLGPU

    assert NVMLGPU.stand_in is GPU.stand_in  # real GPUs inherit "None: nothing to emulate"
    for module in ("hook.py", "gpu/rank_gpu.py", "gpu/timing.py"):
        assert "isinstance" not in (CLIENT / module).read_text()


def test_a_trace_is_written_only_when_asked(tmp_path, monkeypatch):
    assert Trace.open(ClientSettings.load().trace_dir, 0) is None
    monkeypatch.setenv(TRACE_DIR_ENV, str(tmp_path / "env"))
    trace = Trace.open(ClientSettings.load().trace_dir, 2)
    assert trace is not None and trace.path == tmp_path / "env" / "rank2.jsonl"
    trace.write({"kind": "job", "job_id": "j", "rank": 2})
    trace.close()
    explicit = Trace.open(tmp_path / "arg", 1)
    assert explicit is not None and explicit.path == tmp_path / "arg" / "rank1.jsonl"
    explicit.close()
    lines = (tmp_path / "env" / "rank2.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"kind": "job", "job_id": "j", "rank": 2}]
