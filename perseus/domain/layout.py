"""The parallel layout of a job: data × pipeline × tensor parallel degrees, checked in one place.

The job describes it when it registers (`perseus.protocol.JobInfo`), every rank checks its
own coordinates against it before it talks to the coordinator (`perseus.client`), and the
coordinator checks each registering rank (`perseus.server`): all three ask this class, so
the rules and their messages are the same everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from perseus.errors import ConfigurationError

__all__ = ["ParallelLayout"]


@dataclass(frozen=True)
class ParallelLayout:
    """``dp_degree · pp_degree · tp_degree`` GPUs; raises `ConfigurationError` unless each is ≥ 1."""

    dp_degree: int
    pp_degree: int
    tp_degree: int

    def __post_init__(self) -> None:
        for name in ("dp_degree", "pp_degree", "tp_degree"):
            value = getattr(self, name)
            if value < 1:
                raise ConfigurationError(f"{name}={value!r} must be at least 1")

    @property
    def world_size(self) -> int:
        """The number of ranks the layout has."""
        return self.dp_degree * self.pp_degree * self.tp_degree

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
