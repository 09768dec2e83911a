"""Protocol 2's admission rules: a leader registers for, and reports, exactly its block of
replicas (`perseus.domain.layout.Leaders`); under protocol 1 no rank speaks for another.
Each refusal names the rule; nothing of the job changes."""

from __future__ import annotations

from perseus.domain.layout import Leaders
from perseus.errors import InvalidRankError, InvalidResultError
from perseus.protocol import ProfilingResult, RankInfo
from perseus.server.job.barrier import ranks_text

__all__ = ["check_registration", "check_result"]


def check_registration(job_id: str, leaders: Leaders | None, info: RankInfo) -> None:
    """Protocol 2: a registering rank must be a leader and speak for its block."""
    if leaders is None:
        if info.replicas is not None:
            raise InvalidRankError(
                f"Rank {info.rank} registered with replicas, which only the leaders of a "
                f"protocol-2 job send; job {job_id} runs protocol 1 (every rank "
                "registers for itself)",
                rank=info.rank,
            )
        return
    if not leaders.is_leader(dp_rank=info.dp_rank, tp_rank=info.tp_rank):
        raise InvalidRankError(
            f"Rank {info.rank} (dp_rank {info.dp_rank}, pp_rank {info.pp_rank}, tp_rank "
            f"{info.tp_rank}) is not a leader of job {job_id}: {leaders.rule}",
            rank=info.rank,
        )
    block = list(leaders.block(info.dp_rank))
    if info.replicas != block:
        said = "none" if info.replicas is None else ranks_text(info.replicas)
        raise InvalidRankError(
            f"Leader rank {info.rank} (dp_rank {info.dp_rank}, pp_rank {info.pp_rank}) of "
            f"job {job_id} says it speaks for replicas {said}, but with "
            f"{leaders.per_stage} leader(s) per stage it speaks for replicas "
            f"{ranks_text(block)}",
            rank=info.rank,
        )


def check_result(
    job_id: str,
    leaders: Leaders | None,
    info: RankInfo | None,
    round_number: int,
    result: ProfilingResult,
) -> None:
    """A leader's result holds one `ReplicaFigures` per replica of its block, in order;
    a protocol-1 rank's none."""
    got = [f.dp_rank for f in result.replicas]
    if leaders is None:
        if got:
            raise InvalidResultError(
                f"Rank {result.rank} reported replicas, which only the leaders of a "
                f"protocol-2 job report; job {job_id} runs protocol 1",
                rank=result.rank,
            )
        return
    if info is None:
        raise InvalidResultError(
            f"Rank {result.rank} is not a registered leader of job {job_id}", rank=result.rank
        )
    block = list(leaders.block(info.dp_rank))
    if got != block:
        raise InvalidResultError(
            f"Result of leader rank {result.rank} for round {round_number} of job "
            f"{job_id} refused: it holds figures of replicas "
            f"{ranks_text(got) if got else 'none'}; a leader reports one entry per "
            f"replica it speaks for, in order: {ranks_text(block)}",
            rank=result.rank,
        )
