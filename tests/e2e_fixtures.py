"""Shared helpers of the end-to-end tests: a real coordinator, real torchrun jobs.

Everything runs for real: the coordinator is `python -m perseus serve` on a free loopback
port (`perseus.demo.Coordinator`), the job is `python -m torch.distributed.run ... -m
perseus.train` with gloo and emulated GPUs, and the assertions read the per-rank traces
the hook writes. Jobs use nominal emulation (``PERSEUS_EMULATE_NOMINAL=1``): each layer's
forward takes `NOMINAL_MS_PER_LAYER` at the max clock whatever the (tiny) CPU compute
took, so numeric assertions hold on a busy 2-core CI machine. The GPUs' sensors are the
default, real ones (an energy counter refreshing every 100 ms): profiling rounds last about
2 s, so jobs that profile run tens of steps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from paths import TESTS, require_module

from perseus.client.settings import EmulationSettings
from perseus.demo import Coordinator, DemoJob, read_traces, run_training, torchrun_command
from zeus_power.device.emulated import DVFSModel

__all__ = [
    "NOMINAL_MS_PER_LAYER",
    "Coordinator",
    "DemoJob",
    "executed",
    "expected_instruction",
    "launch_ranks",
    "read_traces",
    "request_counts",
    "require_torch",
    "run_job",
    "runs_its_leaders_schedules",
    "scheduler_under_test",
    "steps_of",
    "torchrun_command",
    "truth_of",
]

NOMINAL_MS_PER_LAYER = 4.0
GPU_TYPE = "A100-SXM"


def require_torch() -> None:
    require_module("torch")


def scheduler_under_test(default: str = "Perseus") -> tuple[str, dict[str, str]]:
    """The scheduler an e2e test that judges a deployed plan runs, and the environment its
    coordinator needs: ``PERSEUS_E2E_SCHEDULER`` when set (a `broken_plans` scheduler, to see
    the test's checks fail on a plan that breaks its promise), else `default`. A plugin
    (``module:Class``) is imported from tests/, which goes on the coordinator's
    ``PYTHONPATH``."""
    name = os.environ.get("PERSEUS_E2E_SCHEDULER", "").strip() or default
    if ":" not in name:
        return name, {}
    paths = [str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]
    return name, {"PYTHONPATH": os.pathsep.join(paths)}


def run_job(
    tmp: Path,
    spec: DemoJob,
    coordinator: Coordinator | None,
    *,
    name: str = "job",
    timeout_s: float = 240.0,
) -> tuple[int, dict[int, list[dict[str, Any]]], str]:
    """Run a torchrun job; returns (exit status, traces by rank, log text)."""
    trace_dir = tmp / f"{name}-trace"
    log = tmp / f"{name}.log"
    status = run_training(
        spec,
        coordinator.url if coordinator else None,
        trace_dir=trace_dir,
        log_path=log,
        timeout_s=timeout_s,
    )
    return status, read_traces(trace_dir), log.read_text(errors="replace")


def truth_of(
    truth_dir: Path, *, clear_only: bool = False
) -> dict[tuple[int, str, int], tuple[float, float]]:
    """(stage, kind, MHz) → the median (time, energy) of the instructions the emulated GPUs
    ran (``PERSEUS_EMULATE_TRUTH``), each at its own clock: those that ran partly at the
    previous clock (a change still landing) are left out where others ran clear of a change,
    as the profiler leaves them out. `clear_only`: keys no instruction ran clear of a change
    are left out too (their truth mixes two clocks)."""
    import pandas as pd

    frame = pd.concat(pd.read_csv(p) for p in sorted(Path(truth_dir).glob("rank*.csv")))
    keys = ["stage", "instruction", "frequency"]
    clear = frame.groupby(keys)["switching"].transform("min") == 0
    kept = frame.switching == 0 if clear_only else ~clear | (frame.switching == 0)
    typical = frame[kept].groupby(keys)[["time", "energy"]].median()
    return {(int(s), str(k), int(f)): (t, e) for (s, k, f), (t, e) in typical.iterrows()}


def executed(records: Sequence[dict[str, Any]], step: int) -> list[tuple[str, int]]:
    """(instruction, freq_mhz) of every instruction a rank ran in `step`, in order."""
    return [
        (r["instruction"], r["freq_mhz"])
        for r in records
        if r["kind"] == "instruction" and r["step"] == step
    ]


def steps_of(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["kind"] == "step"]


DECISIONS = ("deployed", "held", "move", "fallback", "redeploy", "reprofile", "resumed")
"""Events of ``promise.jsonl`` that change what the job runs (not checks that kept the plan,
nor notes such as ``profile_left_out`` or ``solve_failed``, which a ``held`` follows)."""


def decisions(job_dir: Path) -> list[dict[str, Any]]:
    """The job's decisions in ``promise.jsonl`` (`DECISIONS`), oldest first."""
    lines = (Path(job_dir) / "promise.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] in DECISIONS]


def last_decision_round(job_dir: Path) -> int:
    """The round of the job's last decision in ``promise.jsonl`` (`decisions`)."""
    return max(e["round"] for e in decisions(job_dir))


def steps_after_round(records: Sequence[dict[str, Any]], round_: int) -> list[int]:
    """The steps a rank ran in rounds after `round_`."""
    return [r["step"] for r in steps_of(records) if r["round"] > round_]


def runs_its_leaders_schedules(traces: dict[int, list[dict[str, Any]]]) -> int:
    """Check that every rank ran, in every round, the list its stage leader handed out for
    its replica that round (the leader's ``handed_out`` trace record), and executed it in
    every step of the round; returns the number of rounds. A leader that speaks for itself
    alone ran what it got."""
    jobs = {r: next(x for x in records if x["kind"] == "job") for r, records in traces.items()}
    rounds = 0
    for rank, records in traces.items():
        job = jobs[rank]
        leader = traces[job["leader"]]
        handed = {x["round"]: x.get("handed_out") for x in leader if x["kind"] == "schedule"}
        schedules = [x for x in records if x["kind"] == "schedule"]
        assert [x["round"] for x in schedules] == list(range(len(schedules))), rank
        for x in schedules:
            assert x["leader"] == job["leader"], (rank, x)
            out = handed[x["round"]]
            if out is None:  # the leader speaks for itself alone
                assert job["leader"] == rank
                continue
            own = out["replica_frequencies"].get(str(job["dp_rank"]), out["frequencies"])
            assert [tuple(e) for e in x["frequencies"]] == [tuple(e) for e in own], (rank, x)
            for step in {
                s["step"] for s in records if s["kind"] == "step" and s["round"] == x["round"]
            }:
                assert [list(e) for e in executed(records, step)] == [list(e) for e in own], (
                    rank,
                    step,
                )
        rounds = max(rounds, len(schedules))
    return rounds


def request_counts(url: str) -> dict[tuple[str, str], float]:
    """(route template, method) → requests the coordinator answered, any status
    (``perseus_http_requests_total``)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    counts: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for s in family.samples:
            if s.name == "perseus_http_requests_total":
                key = (s.labels["route"], s.labels["method"])
                counts[key] = counts.get(key, 0.0) + s.value
    return counts


def expected_instruction(
    layers: int, instruction: str, freq_mhz: int, *, ms_per_layer: float = NOMINAL_MS_PER_LAYER
) -> tuple[float, float]:
    """The emulator's model: (time_s, energy_j) of one instruction of a `layers`-layer stage
    (its kind's workload: `perseus.client.settings.KIND_PRESETS`, the default preset)."""
    model = DVFSModel(GPU_TYPE)
    work = EmulationSettings().workload(instruction)
    nominal_s = ms_per_layer / 1000 * layers * (2 if instruction == "backward" else 1)
    time_s = nominal_s * model.stretch_factor(work, freq_mhz)
    return time_s, model.power_w(work, freq_mhz) * time_s


def launch_ranks(
    spec: DemoJob,
    server_url: str,
    trace_dir: Path,
    *,
    master_port: int,
) -> list[subprocess.Popen[str]]:
    """Start every rank as a plain process (no torchrun agent that would tear them down)."""
    procs = []
    base_env = spec.environment(trace_dir)
    for rank in range(spec.nproc):
        env: Mapping[str, str] = {
            **base_env,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(spec.nproc),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(master_port),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "perseus.train", *spec.train_args(server_url)],
                env=dict(env),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=os.getcwd(),
            )
        )
    return procs
