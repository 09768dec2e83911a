"""Helpers for the coordinator and scheduler tests: a real uvicorn server on loopback and a
simulated pipeline job whose ranks' results come from emulated GPUs.

`GroundTruth` describes the emulated job: per pipeline (virtual) stage the forward's time
at the GPU's max clock and its memory-bound share (a backward is twice a forward's work,
each half of a split backward one forward's), the GPU type, a per-pipeline slowdown (a
straggler), and the costs the profile does not hold (clock-switch, hop and host latency; 0
by default). Its `time_s`, `energy_j` and `p2p_power_w` are the emulator's own model
numbers (`zeus_power.device.DVFSModel` through `perseus.synth`), for tests to write truth
profiles and expected values.

`SimulatedJob` drives a job's ranks through the real coordinator over HTTP: the ranks'
schedules come from the server, and a `perseus.demo.virtual.VirtualCluster` runs them on
`EmulatedGPU`s in virtual time and produces what the ranks report (instruction times and
energies, iteration times and the energy counters' changes). With `leaders_per_stage` the
job speaks protocol 2: only its leaders talk, each reporting its group's round folded as
the client folds it in-job (`perseus.client.wire.fold.GroupFold`), and every rank of a group
runs its replica's list of its leader's schedule. Nothing here computes a
"measured" figure with the solver's formulas. What the emulator measures differs from the
solver's accounting where a real job's would: a round runs one iteration, which every rank
starts together (the round's schedules arrive together) and ends with its own last
instruction, so the blocked tail a plan charges to the ranks that finish first is in no
rank's iteration energy (`planned_energy` adds it back).
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
import uvicorn
from fastapi import FastAPI

from perseus.client.wire.fold import GroupFold
from perseus.demo.virtual import VirtualCluster
from perseus.domain.profile import InstructionProfile
from perseus.domain.schedule import PipelineSchedule, make_schedule
from perseus.io.profile_csv import save_profile
from perseus.protocol import (
    JOB_TOKEN_HEADER,
    PROTOCOL_VERSION,
    FrequencySchedule,
    JobInfo,
    Leaders,
    PipelineSpec,
    ProfilingResult,
    RankInfo,
    RoundStatus,
)
from perseus.server import create_app
from perseus.settings import PerseusSettings
from perseus.synth import stage_workloads, synthesize_profile
from zeus_power.device import DVFSModel, Workload
from zeus_power.device.specs import get_gpu_spec
from zeus_power.serving import header_timeout_protocol

GPU = "A100-SXM"
"""The emulated GPU of the simulated jobs (its top clock is not power-capped at the default
limit, so the max clock is the fastest)."""
FREQS = get_gpu_spec(GPU).supported_sm_clocks_mhz()  # 1410 … 210 MHz, 81 clocks 15 MHz apart
F_MAX = FREQS[0]
ENERGY_ABS_J = 1e-3
"""How close a measured instruction energy comes to the model's: the GPU's energy counter
counts whole millijoules, and an instruction's energy is the difference of two readings."""


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
    """Megatron order: tp fastest, then pp... here rank = (dp·pp + pp_rank)·tp + tp_rank.
    `freqs`: the GPUs' clocks (default: the emulated `GPU`'s, `FREQS`)."""
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
    """The simulated job's GPUs and model (see the module docstring)."""

    forward_s: list[float]
    """Per pipeline (virtual) stage, the forward's time at the max clock (backward = 2×,
    backward_input = backward_weight = 1× the forward's work)."""
    memory_fraction: list[float] | None = None
    """Per stage, the clock-insensitive share of that time (default 0.3)."""
    slowdown: dict[int, float] = field(default_factory=dict)
    """dp_rank → factor on that pipeline's work (a straggler); read at every round."""
    gpu_type: str = GPU
    switch_latency_s: float = 0.0
    """How long a GPU takes to apply a locked clock."""
    hop_latency_s: float = 0.0
    """Time added to every DAG edge between two pipeline ranks."""
    host_gap_s: float = 0.0
    """Host time before every instruction on its rank."""
    model: DVFSModel = field(init=False, repr=False)
    workloads: dict[tuple[int, str], Workload] = field(init=False, repr=False)
    """(stage, kind) → the work one GPU of the stage runs."""

    def __post_init__(self) -> None:
        self.model = DVFSModel(self.gpu_type)
        fractions = self.memory_fraction or [0.3] * len(self.forward_s)
        self.workloads = {}
        for stage, (t0, m) in enumerate(zip(self.forward_s, fractions, strict=True)):
            ((fwd, bwd),) = stage_workloads(
                self.gpu_type, [1.0], base_forward_ms=t0 * 1000.0, memory_fraction=m
            )
            for kind, work in (
                ("forward", fwd),
                ("backward", bwd),
                ("backward_input", fwd),
                ("backward_weight", fwd),
            ):
                self.workloads[stage, kind] = work

    @property
    def freqs(self) -> list[int]:
        """The GPU's supported clocks, descending."""
        return self.model.supported_sm_clocks_mhz()

    @property
    def p2p_power_w(self) -> float:
        """What one GPU draws while blocked on its pipeline peers."""
        return self.model.spec.p2p_block_power_w

    def time_s(self, stage: int, kind: str, freq: int) -> float:
        """One instruction's time at `freq` on one GPU, as the emulator runs it."""
        return self.model.time_s(
            self.workloads[stage, kind], freq, self.model.spec.default_power_limit_w
        )

    def energy_j(self, stage: int, kind: str, freq: int) -> float:
        """One instruction's energy at `freq` on one GPU, as the emulator runs it."""
        return self.model.energy_j(
            self.workloads[stage, kind], freq, self.model.spec.default_power_limit_w
        )

    def cluster(self, pipeline: PipelineSchedule, *, dp: int = 1, tp: int = 1) -> VirtualCluster:
        """The emulated job running `pipeline` on ``pp × dp × tp`` GPUs."""
        if pipeline.num_virtual_stages != len(self.forward_s):
            raise ValueError(
                f"The {pipeline.name} pipeline has {pipeline.num_virtual_stages} stage(s); "
                f"the truth describes {len(self.forward_s)}"
            )
        return VirtualCluster(
            pipeline,
            self.workloads,
            gpu_type=self.gpu_type,
            dp_degree=dp,
            tp_degree=tp,
            switch_latency_s=self.switch_latency_s,
            hop_latency_s=self.hop_latency_s,
            host_gap_s=self.host_gap_s,
            slowdown=dict(self.slowdown),
        )


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
        leaders_per_stage: int | None = None,
    ) -> None:
        """A job of `pp` pipeline ranks running 1F1B over `num_microbatches` that describes
        no pipeline (an old client), or one that describes `schedule` at registration.
        Its ranks run on `truth.cluster(...)` and register what they measured on their
        GPUs (clocks, switch latency), not marked emulated (a test marks them by changing
        `infos`). `token`: the coordinator's (default: ``PERSEUS_TOKEN``); the job's
        credential is taken from the registration's answer and sent on every later
        request."""
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
        self.cluster = truth.cluster(
            schedule or make_schedule("1f1b", pp, num_microbatches), dp=dp, tp=tp
        )
        self.info = job_info(pp, dp, tp, pipeline=spec)
        self.all_infos = [
            i.model_copy(update={"emulated": False}) for i in self.cluster.rank_infos()
        ]
        """Every rank of the job."""
        self.infos = self.all_infos
        """The ranks that talk: every rank, or the leaders (`leaders_per_stage`)."""
        self.folds: dict[int, GroupFold] = {}
        """Protocol 2: leader rank → how its group's round folds into its result."""
        if leaders_per_stage is not None:
            self.info = self.info.model_copy(
                update={
                    "protocol_version": PROTOCOL_VERSION,
                    "leaders_per_stage": leaders_per_stage,
                }
            )
            rule = Leaders(self.info.layout, leaders_per_stage)
            self.infos = []
            for i in self.all_infos:
                if rule.is_leader(dp_rank=i.dp_rank, tp_rank=i.tp_rank):
                    block = rule.block(i.dp_rank)
                    self.infos.append(i.model_copy(update={"replicas": list(block)}))
                    members = [
                        m.rank
                        for m in self.all_infos
                        if m.pp_rank == i.pp_rank and m.dp_rank in block
                    ]
                    self.folds[i.rank] = GroupFold(
                        leader=i.rank, members=sorted(members), replicas=block
                    )
        self.num_microbatches = num_microbatches
        self.job_id: str | None = None
        self.history: list[dict[int, FrequencySchedule]] = []
        self.statuses: list[RoundStatus | None] = []
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
        # What each rank runs; rank 0's status (what it logs) is kept apart, so that rounds
        # running the same clocks compare equal.
        self.statuses.append(schedules[min(schedules)].status)
        schedules = {r: s.model_copy(update={"status": None}) for r, s in schedules.items()}
        self.history.append(schedules)
        return schedules

    def every_rank(self, schedules: dict[int, FrequencySchedule]) -> dict[int, FrequencySchedule]:
        """What every rank runs: its own schedule, or (protocol 2) its replica's list of its
        leader's."""
        if not self.folds:
            return schedules
        out = {}
        for leader, fold in self.folds.items():
            for m in fold.members:
                dp = self._dp[m]
                out[m] = FrequencySchedule(
                    rank=m, frequencies=schedules[leader].frequencies_for(dp)
                )
        return dict(sorted(out.items()))

    @property
    def _dp(self) -> dict[int, int]:
        return {i.rank: i.dp_rank for i in self.all_infos}

    def results_for(self, schedules: dict[int, FrequencySchedule]) -> list[ProfilingResult]:
        """What the talking ranks report for one round of `schedules`, run on the emulated
        GPUs: every rank's result, or (protocol 2) each leader's folded group."""
        self.cluster.slowdown = dict(self.truth.slowdown)
        results = self.cluster.run_round(list(self.every_rank(schedules).values()))
        if not self.folds:
            return results
        by_rank = {r.rank: r for r in results}
        return [fold.fold(by_rank, self._dp) for fold in self.folds.values()]

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
    """The emulator's exact profile of `truth`'s first `num_stages` stages at every supported
    clock, as a short-form CSV (`perseus.synth.synthesize_profile`)."""
    pairs = [
        (truth.workloads[s, "forward"], truth.workloads[s, "backward"]) for s in range(num_stages)
    ]
    frame = synthesize_profile(truth.gpu_type, pairs)
    save_profile(InstructionProfile.from_frame(frame), path)
    return path


def all_max_round(
    truth: GroundTruth, pipeline: PipelineSchedule, *, dp: int = 1, tp: int = 1
) -> list[ProfilingResult]:
    """Every rank's result of one round at the GPUs' top clock, on a fresh emulated job."""
    cluster = truth.cluster(pipeline, dp=dp, tp=tp)
    top = truth.freqs[0]
    return cluster.run_round(
        [
            FrequencySchedule(
                rank=r,
                frequencies=[(i.kind, top) for i in pipeline.orders[cluster.layout_of(r)[1]]],
            )
            for r in range(cluster.world_size)
        ]
    )


def planned_energy(
    results: list[ProfilingResult], p2p_power_w: float, dp_rank_of: dict[int, int]
) -> float:
    """One round's first-pipeline energy per iteration as a plan accounts it: what its GPUs
    measured, plus their blocking power (`p2p_power_w`, one GPU's) from each rank's last
    instruction to the end of the pipeline's iteration (its slowest rank's), which the
    rank's own iteration does not include."""
    first = [r for r in results if dp_rank_of[r.rank] == 0]
    time_s = max(r.iter_time[0] for r in first)
    return math.fsum(r.iter_energy[0] + p2p_power_w * (time_s - r.iter_time[0]) for r in first)


def pipeline_energy_and_time(
    results: list[ProfilingResult], dp_rank_of: dict[int, int]
) -> tuple[float, float]:
    """(energy of the first pipeline's GPUs, iteration time) of one simulated round."""
    energy = math.fsum(r.iter_energy[0] for r in results if dp_rank_of[r.rank] == 0)
    return energy, max(r.iter_time[0] for r in results)
