"""The parallel layout of a job: data × pipeline × tensor parallel degrees, checked in one place,
and who among its ranks leads (talks to the coordinator).

The job describes it when it registers (`perseus.protocol.JobInfo`), every rank checks its
own coordinates against it before it talks to the coordinator (`perseus.client`), and the
coordinator checks each registering rank (`perseus.server`): all three ask this module, so
the rules and their messages are the same everywhere.

**Leaders** (`Leaders`). The tensor-parallel ranks of a stage run the same schedule and the
data-parallel replicas the same pipeline, so the coordinator needs to hear from few of
them. The ``dp_degree`` replicas are cut into `Leaders.per_stage` contiguous blocks (as even
as they go: block ``i`` holds replicas ``⌊i·D/k⌋ .. ⌊(i+1)·D/k⌋ − 1``); in every pipeline
stage, the tensor-rank-0 process of each block's first replica is that block's **leader**:
it registers, reports and fetches schedules over HTTP for every rank of the stage in its
block (its **group**: the block's replicas × all tensor ranks), and the others get their
schedule from it over the job's own process group. One block (the default) gives
``pp_degree`` leaders whatever the job's size; ``dp_degree`` blocks give one leader per
replica and stage; a job with ``dp_degree = tp_degree = 1`` has every rank lead itself.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from perseus.errors import ConfigurationError

__all__ = ["DEFAULT_LEADERS_PER_STAGE", "Leaders", "ParallelLayout"]

DEFAULT_LEADERS_PER_STAGE = 1
"""Leaders per pipeline stage unless the job says otherwise."""


@dataclass(frozen=True)
class ParallelLayout:
    """``dp_degree · pp_degree · tp_degree`` GPUs; raises `ConfigurationError` unless each is ≥ 1.

    The one description of a job's layout: its degrees, its rank numbering (`rank_of`,
    `coordinates`) and the checks of both, for the client, the coordinator, the demo's
    virtual pipeline and the example training job alike.
    """

    dp_degree: int
    pp_degree: int
    tp_degree: int

    def __post_init__(self) -> None:
        for name in ("dp_degree", "pp_degree", "tp_degree"):
            value = getattr(self, name)
            if value < 1:
                raise ConfigurationError(f"{name}={value!r} must be at least 1")

    @classmethod
    def of_world(cls, world_size: int, *, pp_degree: int, tp_degree: int = 1) -> ParallelLayout:
        """The layout of `world_size` ranks in pipelines of `pp_degree` stages of
        `tp_degree` ranks each (``dp_degree`` follows); `ConfigurationError` unless they
        divide it."""
        if pp_degree < 1 or tp_degree < 1:
            raise ConfigurationError(
                f"pp_degree={pp_degree!r} and tp_degree={tp_degree!r} must be at least 1"
            )
        per_replica = pp_degree * tp_degree
        if world_size < 1 or world_size % per_replica:
            raise ConfigurationError(
                f"world size {world_size} is not a multiple of the {pp_degree} pipeline "
                f"ranks × {tp_degree} tensor rank(s); launch pp_degree × tp_degree × "
                "dp_degree processes"
            )
        return cls(world_size // per_replica, pp_degree, tp_degree)

    @property
    def world_size(self) -> int:
        """The number of ranks the layout has."""
        return self.dp_degree * self.pp_degree * self.tp_degree

    def rank_of(self, dp_rank: int, pp_rank: int, tp_rank: int = 0) -> int:
        """The rank at these coordinates. Ranks are numbered pipeline-major, tensor ranks
        fastest: ``rank = (dp_rank · pp_degree + pp_rank) · tp_degree + tp_rank``."""
        self.check_coordinates(rank=0, dp_rank=dp_rank, pp_rank=pp_rank, tp_rank=tp_rank)
        return (dp_rank * self.pp_degree + pp_rank) * self.tp_degree + tp_rank

    def coordinates(self, rank: int) -> tuple[int, int, int]:
        """``(dp_rank, pp_rank, tp_rank)`` of `rank` (the inverse of `rank_of`)."""
        if not 0 <= rank < self.world_size:
            raise ConfigurationError(f"rank={rank!r} must be in [0, {self.world_size})")
        copy, tp_rank = divmod(rank, self.tp_degree)
        dp_rank, pp_rank = divmod(copy, self.pp_degree)
        return dp_rank, pp_rank, tp_rank

    def check_world_size(self, world_size: int) -> None:
        """Raise `ConfigurationError` unless the degrees multiply to `world_size`."""
        if self.world_size != world_size:
            raise ConfigurationError(
                f"dp_degree·pp_degree·tp_degree = {self.dp_degree}·{self.pp_degree}·"
                f"{self.tp_degree} != world_size {world_size}"
            )

    def out_of_range(
        self, *, rank: int, dp_rank: int, pp_rank: int, tp_rank: int
    ) -> tuple[str, int, int] | None:
        """The first coordinate outside its range, as ``(name, value, bound)``, or None."""
        for name, value, bound in (
            ("rank", rank, self.world_size),
            ("dp_rank", dp_rank, self.dp_degree),
            ("pp_rank", pp_rank, self.pp_degree),
            ("tp_rank", tp_rank, self.tp_degree),
        ):
            if not 0 <= value < bound:
                return name, value, bound
        return None

    def check_coordinates(self, *, rank: int, dp_rank: int, pp_rank: int, tp_rank: int) -> None:
        """Raise `ConfigurationError` unless every coordinate lies in ``[0, degree)``."""
        bad = self.out_of_range(rank=rank, dp_rank=dp_rank, pp_rank=pp_rank, tp_rank=tp_rank)
        if bad is not None:
            name, value, bound = bad
            raise ConfigurationError(f"{name}={value!r} must be in [0, {bound})")


@dataclass(frozen=True)
class Leaders:
    """Who leads in a job of `layout` with `per_stage` leaders per pipeline stage (see the
    module docstring); `ConfigurationError` unless ``1 ≤ per_stage ≤ dp_degree``."""

    layout: ParallelLayout
    per_stage: int = DEFAULT_LEADERS_PER_STAGE

    def __post_init__(self) -> None:
        if not 1 <= self.per_stage <= self.layout.dp_degree:
            raise ConfigurationError(
                f"leaders_per_stage={self.per_stage!r} must be between 1 and dp_degree "
                f"({self.layout.dp_degree}): each leader speaks for at least one replica"
            )

    @property
    def replicas(self) -> tuple[int, ...]:
        """The data-parallel ranks whose tensor-rank-0 processes lead (each block's first)."""
        d, k = self.layout.dp_degree, self.per_stage
        return tuple(i * d // k for i in range(k))

    @property
    def count(self) -> int:
        """Leaders in the job: ``pp_degree · per_stage``."""
        return self.layout.pp_degree * self.per_stage

    def leader_replica(self, dp_rank: int) -> int:
        """The data-parallel rank whose leader speaks for replica `dp_rank`."""
        starts = self.replicas
        return starts[bisect.bisect_right(starts, dp_rank) - 1]

    def block(self, leader_dp_rank: int) -> range:
        """The replicas the leader of replica `leader_dp_rank` speaks for (its block)."""
        starts = self.replicas
        i = starts.index(leader_dp_rank)
        end = starts[i + 1] if i + 1 < len(starts) else self.layout.dp_degree
        return range(leader_dp_rank, end)

    def is_leader(self, *, dp_rank: int, tp_rank: int) -> bool:
        """Whether the rank at these coordinates leads (talks to the coordinator)."""
        return tp_rank == 0 and self.leader_replica(dp_rank) == dp_rank

    @property
    def rule(self) -> str:
        """The rule in words, for messages."""
        replicas = self.replicas
        which = (
            f"data-parallel replica {replicas[0]}"
            if len(replicas) == 1
            else f"data-parallel replicas {', '.join(map(str, replicas))}"
        )
        return (
            f"only the tensor-rank-0 process of {which} of each pipeline stage "
            f"({self.count} leader(s)) calls the coordinator; every other rank gets its "
            "schedule from its stage leader over the job's own process group"
        )
