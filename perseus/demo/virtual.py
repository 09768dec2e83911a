"""A pipeline job on emulated GPUs in virtual time, driven by a real scheduler.

`VirtualCluster` stands in for a ``torchrun`` job: one `EmulatedGPU` per rank on its own
`VirtualClock`, and a pipeline that runs a round of iterations as the hook would measure it.
Every instruction starts as soon as its DAG predecessors are done (plus `hop_latency_s` on
every edge between two pipeline ranks, and `host_gap_s` of host work before it on its own
rank, neither of which the instruction's own time includes); the rank asks its GPU for the
instruction's clock when the instruction starts, and the GPU applies it with its own
switching lag; a rank blocked on its peers draws the GPU's blocking power. The
tensor-parallel ranks of a pipeline rank run each of its instructions together: it starts
on all of them once the last is ready, and its successors wait for the slowest copy. What
the ranks report is each instruction's duration and the energy counter's change over it,
each iteration's time and the counter's change over it (from the iteration's start to the
rank's last instruction): on GPUs with ideal sensors (`EmulatedGPU(sensors="ideal")`), since
only an exact counter shows one instruction's energy. The hook on real sensors reports
energy windows instead; `benchmarks/bench_sensors.py` simulates ranks that do.

The emulator implements clocks, switching and power independently of the planner, so a
plan's prediction checked against a `VirtualCluster` is a check, not a tautology; the model
the planner does not know (hop latency, host gaps, a straggler) is injected here. It runs
in milliseconds, so the whole online loop — profiling, planning, the guard — is tested and
benchmarked in virtual time (`run_rounds`), beside the real-``torchrun`` end-to-end tests.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from perseus.domain.layout import ParallelLayout
from perseus.domain.schedule import Instruction, PipelineSchedule
from perseus.protocol import (
    FrequencySchedule,
    JobRecord,
    PipelineSpec,
    ProfilingResult,
    RankInfo,
)
from zeus_power.device import EmulatedGPU, VirtualClock, Workload

__all__ = ["VirtualCluster", "run_rounds"]

_POLL_S = 1e-4


@dataclass
class VirtualCluster:
    """A job of ``pp × dp × tp`` ranks running `pipeline` on emulated GPUs.

    Args:
        pipeline: The pipeline every data-parallel replica runs.
        workloads: (stage, kind) → the instruction's work (`Workload`), per virtual stage:
            what each tensor-parallel GPU of the stage runs.
        gpu_type: The emulated GPU (`zeus_power.device.specs`).
        dp_degree: Data-parallel replicas.
        tp_degree: Tensor-parallel copies of every pipeline rank, tp fastest in the rank
            numbering: rank = (dp · pp_degree + pp) · tp_degree + tp.
        switch_latency_s: How long each GPU takes to apply a locked clock.
        hop_latency_s: Time added to every DAG edge between two pipeline ranks.
        host_gap_s: Host time before every instruction on its rank (not in its duration).
        slowdown: dp rank → factor on that replica's instruction times (a straggler).
        steps_per_round: Iterations each round runs its schedule.
        noise: Relative noise of the emulated times and powers (0: deterministic).
    """

    pipeline: PipelineSchedule
    workloads: Mapping[tuple[int, str], Workload]
    gpu_type: str = "A100-SXM"
    dp_degree: int = 1
    tp_degree: int = 1
    switch_latency_s: float = 0.015
    hop_latency_s: float = 0.0
    host_gap_s: float = 0.0
    slowdown: dict[int, float] = field(default_factory=dict)
    steps_per_round: int = 1
    noise: float = 0.0
    seed: int = 0
    gpus: list[EmulatedGPU] = field(init=False)
    clocks: list[VirtualClock] = field(init=False)
    layout: ParallelLayout = field(init=False)
    """The ranks' numbering (`ParallelLayout`: checks the degrees once)."""

    def __post_init__(self) -> None:
        self.layout = ParallelLayout(self.dp_degree, self.pipeline.num_stages, self.tp_degree)
        world = self.layout.world_size
        self.clocks = [VirtualClock() for _ in range(world)]
        # Ideal sensors: the ranks report each instruction's own counter change, which only
        # an exact, continuous counter shows (a real one refreshes every 100 ms;
        # benchmarks/bench_sensors.py simulates ranks on those). A device layer without the
        # option (a benchmark's base commit) has only exact counters.
        ideal = (
            {"sensors": "ideal"}
            if "sensors" in inspect.signature(EmulatedGPU.__init__).parameters
            else {}
        )
        self.gpus = [
            EmulatedGPU(
                r,
                gpu_type=self.gpu_type,
                clock=c,
                switch_latency_s=self.switch_latency_s,
                noise=self.noise,
                seed=self.seed + r,
                **ideal,
            )
            for r, c in enumerate(self.clocks)
        ]
        self._dag = self.pipeline.dag()
        self._instructions = self.pipeline.instructions()
        self._position = {ins: k for order in self.pipeline.orders for k, ins in enumerate(order)}

    @property
    def world_size(self) -> int:
        return len(self.gpus)

    def rank_of(self, dp: int, pp: int, tp: int = 0) -> int:
        return self.layout.rank_of(dp, pp, tp)

    def layout_of(self, rank: int) -> tuple[int, int, int]:
        """(dp, pp, tp) of `rank`."""
        return self.layout.coordinates(rank)

    # ------------------------------------------------------------------ registration
    def job_record(self, job_id: str = "virtual-job", **extra: Any) -> JobRecord:
        """The job's record as the coordinator would hold it (the pipeline described)."""
        return JobRecord(
            job_id=job_id,
            pp_degree=self.pipeline.num_stages,
            dp_degree=self.dp_degree,
            tp_degree=self.tp_degree,
            world_size=self.world_size,
            pipeline=PipelineSpec.of(self.pipeline),
            **extra,
        )

    def rank_infos(self) -> list[RankInfo]:
        """Every rank's registration, its clock switch timed on its GPU as the hook does
        (`perseus.client.gpu.frequency.measure_switch_latency`, here in virtual time)."""
        infos = []
        for r, gpu in enumerate(self.gpus):
            dp, pp, tp = self.layout_of(r)
            infos.append(
                RankInfo(
                    rank=r,
                    dp_rank=dp,
                    pp_rank=pp,
                    tp_rank=tp,
                    available_frequencies=gpu.supported_sm_clocks_mhz(),
                    emulated=True,
                    switch_latency_s=self._time_switch(r),
                )
            )
        return infos

    def _time_switch(self, rank: int) -> float:
        gpu, clock = self.gpus[rank], self.clocks[rank]
        clocks = gpu.supported_sm_clocks_mhz()
        target = clocks[len(clocks) // 2]
        start = clock()
        gpu.lock_sm_clocks(target, target)
        while gpu.current_sm_clock_mhz() != target:
            clock.advance(_POLL_S)
        took = clock() - start
        gpu.reset_sm_clocks()
        while gpu.current_sm_clock_mhz() != clocks[0]:
            clock.advance(_POLL_S)
        return took

    # ------------------------------------------------------------------ rounds
    def run_round(self, schedules: Sequence[FrequencySchedule]) -> list[ProfilingResult]:
        """Run every rank's schedule for `steps_per_round` iterations; their results.

        A round starts with every rank at once (the round's schedules arrive together);
        within a round each rank starts its next iteration when it ends the last one, and
        waits in it for its peers, as a real job's ranks do (`_iteration`).

        Raises `ValueError` when a rank has no schedule or its schedule does not list its
        pipeline rank's instructions in order.
        """
        by_rank = {s.rank: s for s in schedules}
        freqs: dict[int, list[int]] = {}
        for r in range(self.world_size):
            if r not in by_rank:
                raise ValueError(f"No schedule for rank {r} of the {self.world_size}")
            order = self.pipeline.orders[self.layout_of(r)[1]]
            entries = by_rank[r].frequencies
            if [k for k, _ in entries] != [i.kind for i in order]:
                raise ValueError(
                    f"Rank {r}'s schedule lists {[k for k, _ in entries]}, but its pipeline "
                    f"rank runs {[i.kind for i in order]}"
                )
            freqs[r] = [f for _, f in entries]
        per_rank: dict[int, dict[str, Any]] = {
            r: {"iter_time": [], "iter_energy": [], "tb": {}, "eb": {}}
            for r in range(self.world_size)
        }
        start = max(c() for c in self.clocks)
        for r in range(self.world_size):
            self._idle_until(r, start)
        for _ in range(self.steps_per_round):
            for dp in range(self.dp_degree):
                self._iteration(dp, freqs, per_rank)
        return [
            ProfilingResult(
                rank=r,
                iter_time=d["iter_time"],
                iter_energy=d["iter_energy"],
                time_breakdown=d["tb"],
                energy_breakdown=d["eb"],
            )
            for r, d in sorted(per_rank.items())
        ]

    def _iteration(
        self,
        dp: int,
        freqs: dict[int, list[int]],
        out: dict[int, dict[str, Any]],
    ) -> None:
        """One iteration of pipeline `dp`: each rank measures it from its own start (the
        end of its previous iteration) to the end of its last instruction."""
        factor = self.slowdown.get(dp, 1.0)
        # Per pipeline rank, its tensor-parallel copies in this replica.
        groups = [
            [self.rank_of(dp, pp, t) for t in range(self.tp_degree)]
            for pp in range(self.pipeline.num_stages)
        ]
        begin = {r: self.clocks[r]() for group in groups for r in group}
        start_mj = {r: self.gpus[r].total_energy_mj() for r in begin}
        for pp, group in enumerate(groups):
            kinds = {i.kind for i in self.pipeline.orders[pp]}
            for r in group:
                for kind in kinds:
                    out[r]["tb"].setdefault(kind, []).append([])
                    out[r]["eb"].setdefault(kind, []).append([])
        finish: dict[Instruction, float] = {}
        for ins in self._instructions:  # topological order; each rank's own order kept
            group = groups[ins.rank]
            ready = max(
                (
                    finish[p] + (self.hop_latency_s if p.rank != ins.rank else 0.0)
                    for p in self._dag.predecessors(ins)
                ),
                default=max(begin[r] for r in group),
            )
            start = max([ready, *(self.clocks[r]() + self.host_gap_s for r in group)])
            work = self.workloads[ins.stage, ins.kind]
            if factor != 1.0:
                work = work.scaled(factor)
            ends = []
            for r in group:
                gpu, clock = self.gpus[r], self.clocks[r]
                self._idle_until(r, start)
                f = freqs[r][self._position[ins]]
                if f != gpu.target_sm_clock_mhz():
                    gpu.lock_sm_clocks(f, f)
                e0 = gpu.total_energy_mj()
                run = gpu.execute(work)
                ends.append(clock())
                out[r]["tb"][ins.kind][-1].append(run.time_s)
                out[r]["eb"][ins.kind][-1].append((gpu.total_energy_mj() - e0) / 1000.0)
            finish[ins] = max(ends)
        for r in begin:
            out[r]["iter_time"].append(self.clocks[r]() - begin[r])
            out[r]["iter_energy"].append((self.gpus[r].total_energy_mj() - start_mj[r]) / 1000.0)

    def _idle_until(self, rank: int, t_s: float) -> None:
        """Advance a rank's clock to `t_s`, its GPU blocked (P2P power) meanwhile."""
        clock, gpu = self.clocks[rank], self.gpus[rank]
        gap = t_s - clock()
        if gap > 0:
            clock.advance(gap)
            gpu.record_busy(gap, gpu.p2p_block_power_w)


def run_rounds(
    scheduler: Any,
    cluster: VirtualCluster,
    rounds: int,
    *,
    on_round: Callable[[int, list[FrequencySchedule], list[ProfilingResult]], None] | None = None,
) -> list[list[FrequencySchedule]]:
    """Drive `scheduler` (a `perseus.schedulers.FrequencyScheduler` built for `cluster`'s job) for
    `rounds` rounds as the coordinator would: schedules out, results in. Returns every
    round's schedules."""
    history = []
    for k in range(rounds):
        schedules = scheduler.next_schedule()
        results = cluster.run_round(schedules)
        scheduler.observe(results)
        history.append(schedules)
        if on_round is not None:
            on_round(k, schedules, results)
    return history
