"""Helpers for the coordinator and scheduler tests: a real uvicorn server on loopback and a
simulated pipeline job whose ranks compute their `ProfilingResult`s from a DVFS-like model.

The model (`GroundTruth`): per pipeline (virtual) stage, a forward takes ``t0`` at the max
frequency, a full backward ``2·t0`` and each half of a split backward (I, W) ``t0``. An
instruction that takes ``t0`` at the max frequency takes
``t0·(0.3 + 0.7·f_max/f)`` at f (30 % memory-bound), drawing ``60 W + 200 W·(f/f_max)^2.5``
while busy, and a GPU blocked on P2P / idle draws `p2p_power_w`. Energy per instruction is
U-shaped in f. The iteration's timing is the instruction DAG's longest path, per
data-parallel pipeline; pipelines synchronise at the end of the iteration (all-reduce), so
every rank's iteration time is the slowest pipeline's.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pandas as pd
import uvicorn
from fastapi import FastAPI

from perseus.domain.profile import InstructionProfile
from perseus.domain.schedule import PipelineSchedule, make_schedule
from perseus.io.profile_csv import save_profile
from perseus.protocol import (
    JOB_TOKEN_HEADER,
    FrequencySchedule,
    JobInfo,
    PipelineSpec,
    ProfilingResult,
    RankInfo,
)
from perseus.server import create_app
from perseus.settings import PerseusSettings
from zeus_power.serving import header_timeout_protocol

FREQS = list(range(1500, 450, -75))  # 1500 … 525 MHz, 14 levels
F_MAX = FREQS[0]


@contextlib.contextmanager
def running_server(
    settings: PerseusSettings,
    *,
    round_timeout_s: float = 30.0,
    serve_like_cli: bool = False,
    app: FastAPI | None = None,
) -> Iterator[str]:
    """Run the real coordinator app under uvicorn in a thread; yields its base URL.
    `serve_like_cli`: with `perseus serve`'s HTTP protocol (its header timeout). `app`: this
    app (made by `create_app`) instead of a new one, e.g. to reach its ``state``."""
    if app is None:
        app = create_app(settings, round_timeout_s=round_timeout_s)
    extra = {"http": header_timeout_protocol(settings.header_timeout_s)} if serve_like_cli else {}
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=2,
        **extra,  # type: ignore[arg-type]
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def single_rank_layout(**overrides: object) -> dict[str, object]:
    """`PerseusOptimizer`'s layout arguments for a one-rank job (no pipeline, no parallelism)."""
    kwargs: dict[str, object] = dict(
        rank=0,
        dp_rank=0,
        pp_rank=0,
        tp_rank=0,
        device_id=0,
        dp_degree=1,
        pp_degree=1,
        tp_degree=1,
        world_size=1,
        server_url="http://127.0.0.1:1",
    )
    kwargs.update(overrides)
    return kwargs


def job_info(pp: int, dp: int = 1, tp: int = 1, *, pipeline: PipelineSpec | None = None) -> JobInfo:
    return JobInfo(
        pp_degree=pp, dp_degree=dp, tp_degree=tp, world_size=pp * dp * tp, pipeline=pipeline
    )


def rank_infos(pp: int, dp: int = 1, tp: int = 1, freqs: list[int] | None = None) -> list[RankInfo]:
    """Megatron order: tp fastest, then pp... here rank = (dp·pp + pp_rank)·tp + tp_rank."""
    out = []
    for d in range(dp):
        for p in range(pp):
            for t in range(tp):
                out.append(
                    RankInfo(
                        rank=(d * pp + p) * tp + t,
                        dp_rank=d,
                        pp_rank=p,
                        tp_rank=t,
                        available_frequencies=list(freqs or FREQS),
                    )
                )
    return out


@dataclass
class GroundTruth:
    """The simulated GPUs and model (see the module docstring)."""

    forward_s: list[float]
    """Per pipeline (virtual) stage, the forward time at max frequency (backward = 2×,
    backward_input = backward_weight = 1×)."""
    p2p_power_w: float = 70.0
    memory_fraction: list[float] | None = None
    """Per stage, the frequency-insensitive share of the time (default 0.3)."""
    slowdown: dict[int, float] = field(default_factory=dict)
    """dp_rank → factor on that pipeline's instruction times (a straggler)."""

    def time_s(self, stage: int, kind: str, freq: int) -> float:
        t0 = self.forward_s[stage] * (2.0 if kind == "backward" else 1.0)
        m = 0.3 if self.memory_fraction is None else self.memory_fraction[stage]
        return t0 * (m + (1.0 - m) * F_MAX / freq)

    def power_w(self, freq: int) -> float:
        return 60.0 + 200.0 * (freq / F_MAX) ** 2.5

    def energy_j(self, stage: int, kind: str, freq: int) -> float:
        return self.power_w(freq) * self.time_s(stage, kind, freq)


def pipeline_timing(schedule: PipelineSchedule, durations: list[list[float]]) -> float:
    """Longest path of the DAG with per-stage durations in execution order."""
    dur = {
        instr: d
        for order, ds in zip(schedule.orders, durations, strict=True)
        for instr, d in zip(order, ds, strict=True)
    }
    dag = schedule.dag()
    finish: dict = {}
    for node in schedule.instructions():
        finish[node] = max((finish[p] for p in dag.predecessors(node)), default=0.0) + dur[node]
    return max(finish.values())


def simulate(
    truth: GroundTruth,
    infos: list[RankInfo],
    schedules: dict[int, FrequencySchedule],
    num_microbatches: int,
    *,
    iterations: int = 1,
    schedule: PipelineSchedule | None = None,
) -> list[ProfilingResult]:
    """Every rank's `ProfilingResult` for running its schedule for `iterations` iterations
    of `schedule` (default: 1F1B over the pipeline ranks)."""
    pp = max(i.pp_rank for i in infos) + 1
    if schedule is None:
        schedule = make_schedule("1f1b", pp, num_microbatches)
    by_dp: dict[int, list[RankInfo]] = {}
    for info in infos:
        by_dp.setdefault(info.dp_rank, []).append(info)
    durations: dict[int, list[float]] = {}
    makespans = []
    for dp, members in by_dp.items():
        factor = truth.slowdown.get(dp, 1.0)
        per_stage: list[list[float]] = [[] for _ in range(pp)]
        for info in members:
            if info.tp_rank != 0:
                continue
            order = schedule.orders[info.pp_rank]
            entries = schedules[info.rank].frequencies
            assert [k for k, _ in entries] == [i.kind for i in order], "plan ≠ the rank's order"
            per_stage[info.pp_rank] = [
                truth.time_s(instr.stage, kind, f) * factor
                for instr, (kind, f) in zip(order, entries, strict=True)
            ]
        for info in members:
            durations[info.rank] = per_stage[info.pp_rank]
        makespans.append(pipeline_timing(schedule, per_stage))
    iter_time = max(makespans)
    results = []
    for info in infos:
        entries = schedules[info.rank].frequencies
        ts = durations[info.rank]
        es = [truth.power_w(f) * t for (_, f), t in zip(entries, ts, strict=True)]
        busy = math.fsum(ts)
        energy = math.fsum(es) + truth.p2p_power_w * (iter_time - busy)
        kinds = sorted({kind for kind, _ in entries})
        tb = {k: [t for (kind, _), t in zip(entries, ts, strict=True) if kind == k] for k in kinds}
        eb = {k: [e for (kind, _), e in zip(entries, es, strict=True) if kind == k] for k in kinds}
        results.append(
            ProfilingResult(
                rank=info.rank,
                iter_time=[iter_time] * iterations,
                iter_energy=[energy] * iterations,
                time_breakdown={k: [v] * iterations for k, v in tb.items()},
                energy_breakdown={k: [v] * iterations for k, v in eb.items()},
            )
        )
    return results


class SimulatedJob:
    """A whole job's ranks driven through the real coordinator with one async client."""

    def __init__(
        self,
        base_url: str,
        truth: GroundTruth,
        *,
        pp: int | None = None,
        dp: int = 1,
        tp: int = 1,
        num_microbatches: int | None = None,
        schedule: PipelineSchedule | None = None,
        token: str | None = None,
    ) -> None:
        """A job of `pp` pipeline ranks running 1F1B over `num_microbatches` that describes
        no pipeline (an old client), or one that describes `schedule` at registration.
        `token`: the coordinator's (default: ``PERSEUS_TOKEN``); the job's credential is
        taken from the registration's answer and sent on every later request."""
        self.base_url = base_url
        token = token if token is not None else os.environ.get("PERSEUS_TOKEN")
        self.headers: dict[str, str] = {"authorization": f"Bearer {token}"} if token else {}
        self.truth = truth
        spec = None
        if schedule is not None:
            spec = PipelineSpec.of(schedule)
            pp, num_microbatches = schedule.num_stages, schedule.num_microbatches
        assert pp is not None and num_microbatches is not None
        self.schedule = schedule
        self.info = job_info(pp, dp, tp, pipeline=spec)
        self.infos = rank_infos(pp, dp, tp)
        self.num_microbatches = num_microbatches
        self.job_id: str | None = None
        self.history: list[dict[int, FrequencySchedule]] = []
        self.results: list[list[ProfilingResult]] = []

    async def register(self, client: httpx.AsyncClient) -> str:
        r = await client.post(
            f"{self.base_url}/register_job", json=self.info.model_dump(), headers=self.headers
        )
        r.raise_for_status()
        self.job_id = r.json()
        self.headers[JOB_TOKEN_HEADER] = r.headers[JOB_TOKEN_HEADER]
        for info in self.infos:
            r = await client.post(
                f"{self.base_url}/register_rank/{self.job_id}",
                json=info.model_dump(),
                headers=self.headers,
            )
            r.raise_for_status()
        return self.job_id

    async def ask_all(self, client: httpx.AsyncClient) -> dict[int, FrequencySchedule]:
        responses = await asyncio.gather(
            *(
                client.get(
                    f"{self.base_url}/schedule/{self.job_id}",
                    params={"rank": i.rank},
                    headers=self.headers,
                )
                for i in self.infos
            )
        )
        for r in responses:
            r.raise_for_status()
        schedules = {
            s.rank: s for s in (FrequencySchedule.model_validate(r.json()) for r in responses)
        }
        self.history.append(schedules)
        return schedules

    def results_for(self, schedules: dict[int, FrequencySchedule]) -> list[ProfilingResult]:
        return simulate(
            self.truth, self.infos, schedules, self.num_microbatches, schedule=self.schedule
        )

    async def report(
        self, client: httpx.AsyncClient, schedules: dict[int, FrequencySchedule]
    ) -> None:
        results = self.results_for(schedules)
        self.results.append(results)
        for res in results:
            r = await client.post(
                f"{self.base_url}/result/{self.job_id}",
                json=res.model_dump(),
                headers=self.headers,
            )
            r.raise_for_status()

    async def run(
        self, client: httpx.AsyncClient, rounds: int
    ) -> list[dict[int, FrequencySchedule]]:
        if self.job_id is None:
            await self.register(client)
        for _ in range(rounds):
            schedules = await self.ask_all(client)
            await self.report(client, schedules)
        return self.history

    def run_sync(self, rounds: int) -> list[dict[int, FrequencySchedule]]:
        async def main() -> list[dict[int, FrequencySchedule]]:
            async with httpx.AsyncClient(timeout=60.0) as client:
                return await self.run(client, rounds)

        return asyncio.run(main())


def stage_freqs(schedules: dict[int, FrequencySchedule], rank: int) -> list[int]:
    return [f for _, f in schedules[rank].frequencies]


def write_truth_profile(truth: GroundTruth, num_stages: int, path: Path) -> Path:
    """The ground truth at every frequency of `FREQS`, as a short-form profile CSV."""
    rows = [
        (stage, kind, f, truth.time_s(stage, kind, f), truth.energy_j(stage, kind, f))
        for stage in range(num_stages)
        for kind in ("forward", "backward")
        for f in FREQS
    ]
    frame = pd.DataFrame(rows, columns=["stage", "instruction", "frequency", "time", "energy"])
    save_profile(InstructionProfile.from_frame(frame), path)
    return path


def pipeline_energy_and_time(
    results: list[ProfilingResult], dp_rank_of: dict[int, int]
) -> tuple[float, float]:
    """(energy of the first pipeline's GPUs, iteration time) of one simulated round."""
    energy = math.fsum(r.iter_energy[0] for r in results if dp_rank_of[r.rank] == 0)
    return energy, max(r.iter_time[0] for r in results)
