"""Zeus 0.16's own clients, unmodified, against our servers (real, on loopback).

Zeus runs in a virtual environment of its own (`zeus016_venv`: PyPI's ``zeus[pfo,bso]==0.16.0``
with pydantic 1); only its GPU layer is emulated (`zeus_assets/zeus016/zeus016_gpu.py`).

- Pipeline frequency: Zeus's `PipelineFrequencyOptimizer` on a 2-rank job registers, gets
  its schedules and applies them to its GPUs; Zeus's default `ProfilingResult` (empty
  breakdowns) is accepted by `AllMaxFrequency` and by `PointSolution` running a Zeus-style
  Python-literal plan, and refused with a 422 naming the scheduler by one that needs them.
- Batch size: Zeus's `BatchSizeOptimizer` with ``server_url=.../zeus``, through its documented
  sequence (`get_batch_size`, `on_train_begin`, `on_evaluate` each epoch), over three
  sessions of one job: converged, failed at max_epochs, and crashed (ended at exit).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_fixtures import running_server as running_coordinator
from zeus016_venv import ASSETS, zeus016_python, zeus_env
from zeus_assets.bso_server import running_server as running_bso

from perseus.domain.schedule import make_schedule
from perseus.settings import PerseusSettings

M = 2
"""Microbatches of the pipeline job (1F1B on 2 ranks): Zeus's client describes no pipeline."""
MAX_MHZ = 1740
"""The emulated A40's top SM clock (`zeus016_gpu`)."""


@pytest.fixture(scope="module")
def zeus_python() -> Path:
    return zeus016_python()


def _run(python: Path, script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [str(python), str(ASSETS / script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=zeus_env(**env),
        check=False,
    )
    return done


# ---------------------------------------------------------------- pipeline frequency


@pytest.fixture(scope="module")
def pfo_run(zeus_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("pfo")
    kinds = make_schedule("1f1b", 2, M).kinds()
    literal = [[(k, 1410 - 15 * (i % 3)) for i, k in enumerate(ks)] for ks in kinds]
    plan = tmp / "frequencies.py"
    plan.write_text(f"# one list per pipeline rank, as lowtime writes it\n{literal!r}\n")
    gpu_log = tmp / "gpu.jsonl"
    coordinators = {
        "allmax": PerseusSettings(
            scheduler="AllMaxFrequency", scheduler_args={"num_microbatches": M}
        ),
        "literal": PerseusSettings(
            scheduler="PointSolution",
            scheduler_args={"solution_path": str(plan), "num_microbatches": M},
        ),
        "needs": PerseusSettings(
            scheduler="InstructionProfiler", scheduler_args={"num_microbatches": M}
        ),
    }
    out = tmp / "out.json"
    with (
        running_coordinator(coordinators["allmax"]) as allmax,
        running_coordinator(coordinators["literal"]) as lit,
        running_coordinator(coordinators["needs"]) as needs,
    ):
        done = _run(
            zeus_python,
            "pfo_job.py",
            str(out),
            f"allmax={allmax}",
            f"literal={lit}",
            f"needs={needs}",
            ZEUS016_GPU_LOG=str(gpu_log),
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
        jobs = {
            name: httpx.get(f"{url}/jobs").json()
            for name, url in [("allmax", allmax), ("literal", lit), ("needs", needs)]
        }
    report = json.loads(out.read_text())
    report["literal_plan"] = literal
    report["gpu_log"] = [json.loads(line) for line in gpu_log.read_text().splitlines()]
    report["jobs"] = jobs
    yield report


def test_zeus_pfo_client_runs_all_max_with_empty_breakdowns(pfo_run: dict) -> None:
    for rank in ("0", "1"):
        case = pfo_run["ranks"][rank]["allmax"]
        assert len(case["schedules"]) == 3  # the first, then one after each round
        for schedule in case["schedules"]:
            assert {f for _, f in schedule} == {MAX_MHZ}
            assert [k for k, _ in schedule] == make_schedule("1f1b", 2, M).kinds()[int(rank)]
        assert [status for status, _ in case["results"]] == [200, 200]
    assert pfo_run["ranks"]["0"]["allmax"]["job_id"].endswith("+zeus016-allmax")


def test_zeus_pfo_client_deploys_a_python_literal_plan(pfo_run: dict) -> None:
    for rank in (0, 1):
        case = pfo_run["ranks"][str(rank)]["literal"]
        expected = [list(e) for e in pfo_run["literal_plan"][rank]]
        assert case["schedules"] == [expected] * 3
        assert [status for status, _ in case["results"]] == [200, 200]
    # Zeus's FrequencyController locked each emulated GPU at the plan's clocks.
    locked = {(e["gpu"], e["mhz"]) for e in pfo_run["gpu_log"] if e["event"] == "lock"}
    for rank in (0, 1):
        assert {(rank, f) for _, f in pfo_run["literal_plan"][rank]} <= locked


def test_a_scheduler_needing_breakdowns_refuses_zeus_results_saying_why(pfo_run: dict) -> None:
    for rank in ("0", "1"):
        [(status, body)] = pfo_run["ranks"][rank]["needs"]["results"]
        assert status == 422
        detail = json.loads(body)["detail"]
        assert "scheduler InstructionProfiler needs them" in detail
        assert "time and energy" in detail


# ---------------------------------------------------------------- batch size


JOB = {
    "job_id": "zeus016-mnist",
    "job_id_prefix": "zeus016",
    "batch_sizes": [32, 64, 128, 256],
    "default_batch_size": 128,
    "target_metric": 0.9,
    "max_epochs": 4,
    "mab_seed": 3,
}
EPOCHS_TO_CONVERGE = {"32": 2, "64": None, "128": 3, "256": 2}


def test_zeus_bso_client_over_three_sessions_of_one_job(zeus_python: Path, tmp_path: Path) -> None:
    with running_bso(f"sqlite:///{tmp_path / 'bso.db'}") as url:
        sessions = []
        for crash in (None, None, 1):
            args = [f"{url}/zeus", json.dumps(JOB), json.dumps(EPOCHS_TO_CONVERGE)]
            if crash is not None:
                args += ["--crash-after", str(crash)]
            done = _run(zeus_python, "bso_session.py", *args)
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
            sessions.append(json.loads(done.stdout.strip().splitlines()[-1]))
        trials = httpx.get(f"{url}/jobs/{JOB['job_id']}/trials").json()

    # Pruning round 1: the default batch size, then smaller (fails: that direction ends),
    # then larger.
    assert [(s["trial_number"], s["batch_size"], s["outcome"]) for s in sessions] == [
        (1, 128, "converged"),
        (2, 64, "failed"),
        (3, 256, "crashed"),
    ]
    assert sessions[0]["epochs"] == 3 and sessions[1]["epochs"] == 4
    assert "max_epochs=4" in sessions[1]["message"]
    assert [(t["trial_number"], t["status"], t["epochs"]) for t in trials] == [
        (1, "succeeded", 3),
        (2, "failed", 4),
        (3, "failed", None),  # ended by Zeus's client at exit, without a result
    ]
    # The energy the server recorded is what Zeus's monitor measured on the emulated GPU.
    assert trials[0]["energy_j"] == pytest.approx(sessions[0]["energy_j"])
    assert trials[0]["energy_j"] > 0
