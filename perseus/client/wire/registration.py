"""A job's registration: the in-job table, the job id shared from its first leader, each
leader's rank registered (collective: every rank of the job calls `register`, in order).

1. Every rank learns every rank's place and GPU, checks them, and joins its stage
   leader's group (`JobFanOut`, `perseus.client.wire.leaders`).
2. The job's first leader registers the job (``POST /register_job``; the pipeline goes
   with it) and broadcasts the id, with the job's credential, to every rank
   (`JobFanOut.share_job_id`); a failure there is every rank's error.
3. Every leader registers its `RankInfo`, speaking for its group.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from perseus.client.facts import GpuFacts
from perseus.client.place import RankPlace
from perseus.client.wire.coordinator import CoordinatorClient
from perseus.client.wire.leaders import JobFanOut
from perseus.protocol import PROTOCOL_VERSION, JobInfo, PipelineSpec, RankInfo

__all__ = ["Registration", "register"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Registration:
    """A registered job as one rank sees it: its id and the rank's part in the fan-out."""

    job_id: str
    fanout: JobFanOut


def register(
    coordinator: CoordinatorClient,
    dist: Any,
    place: RankPlace,
    gpu: GpuFacts,
    *,
    job_metadata: str | None,
    pipeline: PipelineSpec | None,
    leaders_per_stage: int,
    steps_per_round: int,
    fanout_timeout_s: float,
) -> Registration:
    """Register the job and this rank (module docstring); collective."""
    layout = place.layout
    fanout = JobFanOut(
        dist,
        rank=place.rank,
        dp_rank=place.dp_rank,
        pp_rank=place.pp_rank,
        tp_rank=place.tp_rank,
        layout=layout,
        per_stage=leaders_per_stage,
        steps_per_round=steps_per_round,
        pipeline_key=pipeline.model_dump_json() if pipeline is not None else "",
        gpu_name=gpu.name,
        frequencies=gpu.frequencies,
        emulated=gpu.emulated,
        switch_latency_s=gpu.switch_latency_s,
        timeout_s=fanout_timeout_s,
    )

    def register_job() -> str:  # the first leader only; the others learn its result
        job_info = JobInfo(
            pp_degree=layout.pp_degree,
            dp_degree=layout.dp_degree,
            tp_degree=layout.tp_degree,
            world_size=layout.world_size,
            job_metadata=job_metadata,
            pipeline=pipeline,
            protocol_version=PROTOCOL_VERSION,
            leaders_per_stage=leaders_per_stage,
        )
        job_id = coordinator.register_job(job_info)
        # The job's credential travels with its id (ids never hold a newline).
        return f"{job_id}\n{coordinator.job_token(job_id) or ''}"

    shared = fanout.share_job_id(register_job)
    job_id, _, job_token = shared.partition("\n")
    coordinator.set_job_token(job_id, job_token or None)
    if fanout.is_leader:  # it speaks for its group
        coordinator.register_rank(
            job_id,
            RankInfo(
                rank=place.rank,
                dp_rank=place.dp_rank,
                pp_rank=place.pp_rank,
                tp_rank=place.tp_rank,
                available_frequencies=gpu.frequencies,
                emulated=gpu.emulated,
                energy_refresh_s=gpu.energy_refresh_s,
                # The leader's own GPU's: its group's were checked to be the same type.
                power_limit_w=gpu.power_limit_w,
                idle_power_w=gpu.idle_power_w,
                switch_latency_s=fanout.switch_latency_s,
                replicas=list(fanout.replicas),
            ),
        )
    if place.rank == fanout.registrar:
        _log_registered(coordinator.server_url, job_id, place, gpu, pipeline, fanout)
    return Registration(job_id=job_id, fanout=fanout)


def _log_registered(
    server_url: str,
    job_id: str,
    place: RankPlace,
    gpu: GpuFacts,
    pipeline: PipelineSpec | None,
    fanout: JobFanOut,
) -> None:
    shape = (
        f"{pipeline.schedule}, {pipeline.num_microbatches} microbatches"
        if pipeline is not None
        else "the coordinator's default pipeline"
    )
    switch = (
        f"{gpu.switch_latency_s * 1000:.1f} ms" if gpu.switch_latency_s is not None else "unknown"
    )
    layout = place.layout
    logger.info(
        "Perseus: job %s registered with %s: %d rank(s) (pp %d × dp %d × tp %d), "
        "%s; %d leader(s) talk to the coordinator; clock switch on GPU %d: %s",
        job_id,
        server_url,
        layout.world_size,
        layout.pp_degree,
        layout.dp_degree,
        layout.tp_degree,
        shape,
        fanout.leaders.count,
        gpu.device_id,
        switch,
    )
