"""The in-job fan-out with real processes: four ranks in a gloo group drive `PerseusOptimizer`
by hand on emulated GPUs (`leader_ranks.py`) against a real coordinator (`perseus serve`).

- Two leaders per stage, tensor ranks, a `DeviceMesh`: each leader registers for its block
  and its group runs what it hands out each round.
- One GPU of another type: every rank refuses to start, naming the rank that differs,
  before anything talks to the coordinator.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from e2e_fixtures import read_traces, request_counts, runs_its_leaders_schedules
from paths import require_module

from perseus.demo import Coordinator, free_port

require_module("torch.distributed")

RANKS = Path(__file__).with_name("leader_ranks.py")
STEPS = 3


def run_ranks(url: str, world: int, *args: str, timeout_s: float = 120.0) -> list[tuple[int, str]]:
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
                "--master-port",
                str(port),
                "--steps",
                str(STEPS),
                *args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(world)
    ]
    outputs = [p.communicate(timeout=timeout_s)[0] for p in procs]
    return [(p.returncode, out) for p, out in zip(procs, outputs, strict=True)]


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("leaders")
    with Coordinator(
        scheduler="AllMaxFrequency",
        scheduler_args={"num_microbatches": 2},
        dump_dir=tmp / "dump",
        log_path=tmp / "coordinator.log",
    ) as c:
        yield c


def test_two_leaders_per_stage_speak_for_their_tensor_ranks(coordinator, tmp_path):
    before = request_counts(coordinator.url)
    shape = ["--pp", "1", "--dp", "2", "--tp", "2", "--leaders-per-stage", "2"]
    done = run_ranks(coordinator.url, 4, *shape, "--device-mesh", "--trace-dir", str(tmp_path))
    assert all(status == 0 for status, _ in done), done
    after = request_counts(coordinator.url)
    traces = read_traces(tmp_path)
    # rank = (dp·pp + pp)·tp + tp: replicas 0 and 1 each lead themselves, with their tp peer.
    assert {r: next(x for x in t if x["kind"] == "job")["leader"] for r, t in traces.items()} == {
        0: 0,
        1: 0,
        2: 2,
        3: 2,
    }
    assert runs_its_leaders_schedules(traces) == STEPS
    route = ("/register_rank/{job_id}", "POST")
    assert after[route] - before.get(route, 0) == 2
    route = ("/result/{job_id}", "POST")
    assert after[route] - before.get(route, 0) == 2 * STEPS


def test_a_job_with_a_gpu_of_another_type_stops_everywhere_naming_it(coordinator):
    before = request_counts(coordinator.url)
    done = run_ranks(coordinator.url, 4, "--pp", "2", "--dp", "2", "--odd-gpu", "3")
    for status, output in done:
        assert status == 1, output
        assert "The job's GPUs differ" in output
        assert "rank(s) [0-2]: NVIDIA A100-SXM4-40GB (emulated) with 81 SM clocks" in output
        assert "rank(s) [3]: NVIDIA A40 (emulated) with 103 SM clocks" in output
    assert request_counts(coordinator.url).get(("/register_job", "POST")) == before.get(
        ("/register_job", "POST")
    )
