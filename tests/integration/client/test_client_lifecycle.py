"""A job's life cycle end to end: a normal end is ``finished`` everywhere, a crashed rank
still fails the job, and a coordinator that is not there fails the first contact at once.

Real parts: the coordinator is `perseus serve` in a subprocess on loopback (Perseus with a
given profile, dumping with ``PERSEUS_DUMP_KEEP_ROUNDS=2``), the ranks are two plain
processes in a gloo process group driving `PerseusOptimizer` by hand on emulated GPUs
(`lifecycle_ranks.py`), and the report is ``perseus report`` on the dump.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from paths import require_module
from prometheus_client.parser import text_string_to_metric_families
from server_fixtures import single_rank_layout
from typer.testing import CliRunner

from perseus.cli import app as cli_app
from perseus.client import PerseusOptimizer
from perseus.demo import Coordinator, free_port
from perseus.errors import CoordinatorError
from perseus.io.jobdir import JobDir
from perseus.synth import stage_workloads, synthesize_profile
from zeus_power.device.emulated import EmulatedGPU

require_module("torch.distributed")

RANKS = Path(__file__).with_name("lifecycle_ranks.py")
ROUND_TIMEOUT_S = 4.0
STEPS = 10


def run_ranks(url: str, *extra: list[str], timeout_s: float = 120.0) -> list[tuple[int, str]]:
    """Run every rank (``extra[r]``: rank r's own arguments) to its end; (status, output)."""
    port = free_port()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(RANKS),
                "--url",
                url,
                "--rank",
                str(rank),
                "--world",
                "2",
                "--master-port",
                str(port),
                "--steps",
                str(STEPS),
                *own,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank, own in enumerate(extra)
    ]
    outputs = [p.communicate(timeout=timeout_s)[0] for p in procs]
    return [(p.returncode, out) for p, out in zip(procs, outputs, strict=True)]


def metric_samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{url}/metrics").text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lifecycle")
    profile = tmp / "profile.csv"
    synthesize_profile(
        "A100-SXM", stage_workloads("A100-SXM", [1.0, 1.6], base_forward_ms=3)
    ).to_csv(profile, index=False)
    with Coordinator(
        scheduler="Perseus",
        # The life cycle, not the guard: the plan stays whatever two ranks sharing a loaded
        # CPU measure (tests/integration/schedulers/test_schedulers_guard.py checks the guard).
        scheduler_args={"profile_path": str(profile), "max_slowdown": 0.05, "guard": False},
        dump_dir=tmp / "dump",
        log_path=tmp / "coordinator.log",
        round_timeout_s=ROUND_TIMEOUT_S,
        env={"PERSEUS_DUMP_DATA": "true", "PERSEUS_DUMP_KEEP_ROUNDS": "2"},
    ) as c:
        yield c


@pytest.fixture(scope="module")
def finished(coordinator):
    """A job that ends normally; its rank 1 runs its last round a second after rank 0, which
    closes first and waits for it. Returns (job id, rank 0's finish answer)."""
    (s0, out0), (s1, out1) = run_ranks(coordinator.url, [], ["--slow-last-round", "1.0"])
    assert s0 == 0 and s1 == 0, out0 + out1
    report = json.loads(out0.split("finish: ", 1)[1].splitlines()[0])
    return report["job_id"], report


def test_a_normal_end_is_finished_everywhere(coordinator, finished):
    job_id, report = finished
    assert report["rounds"] >= STEPS and report["iterations_measured"] == STEPS
    assert report["energy_j"] > 0 and report["measured_saving"] is not None
    jobs = httpx.get(f"{coordinator.url}/jobs").json()
    assert [(j["job_id"], j["state"]) for j in jobs] == [(job_id, "finished")]
    detail = httpx.get(f"{coordinator.url}/jobs/{job_id}").json()
    assert detail["state"] == "finished" and detail["failure"] is None
    m = metric_samples(coordinator.url)
    assert m["perseus_jobs", (("state", "finished"),)] == 1
    assert m["perseus_jobs", (("state", "failed"),)] == 0
    assert m["perseus_job_state", (("job_id", job_id), ("state", "finished"))] == 1
    assert m["perseus_jobs_ended_total", (("state", "finished"),)] == 1
    assert m["perseus_job_iterations_total", (("job_id", job_id),)] == STEPS
    # Later calls under the job are told it finished (409), not that it failed.
    r = httpx.get(f"{coordinator.url}/schedule/{job_id}", params={"rank": 0})
    assert r.status_code == 409 and "has finished" in r.json()["detail"]


def test_a_finished_job_is_never_failed_and_logs_no_error(coordinator, finished):
    job_id, _ = finished
    job_dir = JobDir.of(coordinator.dump_dir, job_id)
    assert job_dir.finished.is_file()
    time.sleep(ROUND_TIMEOUT_S + 1.0)  # the round the ranks left pending would have timed out
    assert not job_dir.failed.exists()
    assert httpx.get(f"{coordinator.url}/jobs/{job_id}").json()["state"] == "finished"
    log = coordinator.log_path.read_text()
    assert "ERROR" not in log, log


def test_the_report_after_a_normal_end_has_measured_figures(coordinator, finished):
    """PERSEUS_DUMP_KEEP_ROUNDS=2 kept the last two rounds and the report's rounds (the
    newest `REPORT_WINDOW` of each kind): the all-max baseline (the job's rounds 1-4) is
    still there after 10 rounds, and the report from the dump is the coordinator's."""
    job_id, report = finished
    job_dir = JobDir.of(coordinator.dump_dir, job_id)
    rounds = job_dir.rounds()
    assert {1, 2, 3, 4} <= set(rounds), rounds
    result = CliRunner().invoke(cli_app, ["report", str(job_dir.path), "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert body["measured_saving"] is not None and body["measured_slowdown"] is not None
    assert body["measured_saving"] == pytest.approx(report["measured_saving"], rel=1e-9)
    result = CliRunner().invoke(cli_app, ["report", str(job_dir.path)])
    assert "measured unknown" not in result.output and "unknown" not in result.output


def test_a_restarted_coordinator_does_not_revive_a_finished_job(coordinator, finished):
    job_id, _ = finished
    coordinator.stop()
    coordinator.start()
    assert httpx.get(f"{coordinator.url}/jobs").json() == []
    r = httpx.get(f"{coordinator.url}/jobs/{job_id}")
    assert r.status_code == 404


def test_a_job_whose_rank_dies_still_fails(coordinator, finished):
    (s0, out0), (s1, _) = run_ranks(coordinator.url, [], ["--die-after", "3"])
    assert s1 == 3 and s0 != 0, out0
    assert "timed out" in out0 and "never asked" in out0, out0
    failed = [j for j in httpx.get(f"{coordinator.url}/jobs").json() if j["state"] == "failed"]
    assert len(failed) == 1, failed
    job_dir = JobDir.of(coordinator.dump_dir, failed[0]["job_id"])
    assert job_dir.failed.is_file() and not job_dir.finished.exists()


def test_first_contact_with_no_coordinator_fails_fast_naming_the_url(process_group):
    """The default reconnect window (120 s) is for a registered job; registering one with a
    coordinator that is not there fails within 10 s, naming the URL."""
    url = f"http://127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(CoordinatorError, match=f"Cannot reach the Perseus coordinator at {url}"):
        PerseusOptimizer(**single_rank_layout(server_url=url), gpu=EmulatedGPU(0))
    assert time.monotonic() - start < 10.0
