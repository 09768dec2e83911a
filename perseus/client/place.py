"""Where a rank sits in its job: its coordinates in a `ParallelLayout`, checked once.

`RankPlace` is built from the hook's arguments (Zeus's nine integers), from a
`perseus.domain.layout.ParallelLayout` and the rank's coordinates, or from a
``torch.distributed.DeviceMesh`` (`mesh_place`: the mesh's named dimensions); every part of
the client then trusts it. A mesh given beside explicit coordinates must agree with them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from perseus.errors import ConfigurationError
from perseus.protocol import ParallelLayout

__all__ = ["MeshPlace", "RankPlace", "check_layout", "local_device_id", "mesh_place"]


@dataclass(frozen=True)
class RankPlace:
    """One rank's global rank and (dp, pp, tp) coordinates in `layout`; raises
    `ConfigurationError` unless each coordinate lies in ``[0, degree)``."""

    rank: int
    dp_rank: int
    pp_rank: int
    tp_rank: int
    layout: ParallelLayout

    def __post_init__(self) -> None:
        self.layout.check_coordinates(
            rank=self.rank, dp_rank=self.dp_rank, pp_rank=self.pp_rank, tp_rank=self.tp_rank
        )

    @classmethod
    def of(
        cls,
        layout: ParallelLayout | Any,
        *,
        rank: int,
        dp_rank: int = 0,
        pp_rank: int = 0,
        tp_rank: int = 0,
    ) -> RankPlace:
        """The place of `rank` in `layout`: a `ParallelLayout` with the rank's coordinates,
        or a ``DeviceMesh`` (its coordinates and degrees are read from it; the others are
        ignored)."""
        if isinstance(layout, ParallelLayout):
            return cls(rank, dp_rank, pp_rank, tp_rank, layout)
        place = mesh_place(layout)
        degrees = ParallelLayout(place.dp_degree, place.pp_degree, place.tp_degree)
        return cls(rank, place.dp_rank, place.pp_rank, place.tp_rank, degrees)

    @property
    def world_size(self) -> int:
        """The number of ranks of the job."""
        return self.layout.world_size

    def zeus_arguments(self) -> dict[str, int]:
        """This place as the layout arguments of Zeus's (and the hook's) constructor."""
        layout = self.layout
        return {
            "rank": self.rank,
            "dp_rank": self.dp_rank,
            "pp_rank": self.pp_rank,
            "tp_rank": self.tp_rank,
            "dp_degree": layout.dp_degree,
            "pp_degree": layout.pp_degree,
            "tp_degree": layout.tp_degree,
            "world_size": layout.world_size,
        }

    def check_mesh(self, mesh: Any) -> None:
        """`ConfigurationError` unless `mesh` puts this rank where this place does."""
        place = mesh_place(mesh)
        wrong = [
            f"{name}={mine} (the mesh: {getattr(place, name)})"
            for name, mine in (
                ("dp_rank", self.dp_rank),
                ("dp_degree", self.layout.dp_degree),
                ("pp_rank", self.pp_rank),
                ("pp_degree", self.layout.pp_degree),
                ("tp_rank", self.tp_rank),
                ("tp_degree", self.layout.tp_degree),
            )
            if getattr(place, name) != mine
        ]
        if wrong:
            raise ConfigurationError(
                f"Rank {self.rank}: device_mesh disagrees with the layout given: "
                + ", ".join(wrong)
            )


def check_layout(
    rank: int,
    dp_rank: int,
    pp_rank: int,
    tp_rank: int,
    dp_degree: int,
    pp_degree: int,
    tp_degree: int,
    world_size: int,
) -> RankPlace:
    """The place Zeus's positional arguments describe; `ConfigurationError` unless the
    degrees multiply to `world_size` and every coordinate fits its degree."""
    layout = ParallelLayout(dp_degree, pp_degree, tp_degree)
    layout.check_world_size(world_size)
    return RankPlace(rank, dp_rank, pp_rank, tp_rank, layout)


@dataclass(frozen=True)
class MeshPlace:
    """A rank's place read from a `DeviceMesh` (`mesh_place`)."""

    dp_rank: int
    dp_degree: int
    pp_rank: int
    pp_degree: int
    tp_rank: int
    tp_degree: int


_PP_NAMES = ("pp", "pipeline")
_TP_NAMES = ("tp", "tensor")


def mesh_place(mesh: Any) -> MeshPlace:
    """This rank's (dp, pp, tp) coordinates and degrees from a named `DeviceMesh`.

    The dimension named ``pp`` (or ``pipeline``) is the pipeline, ``tp`` (or ``tensor``)
    the tensor-parallel one; every other dimension (``dp``, ``dp_replicate``, ``dp_shard``,
    ``cp``, ...) runs the same pipeline on other data, so together, in the mesh's order,
    they make the data-parallel coordinate. A mesh without names, or with two pipeline or
    tensor dimensions, is a `ConfigurationError`.
    """
    names = getattr(mesh, "mesh_dim_names", None)
    if not names:
        raise ConfigurationError(
            "device_mesh has no dimension names: build it with names, e.g. "
            "init_device_mesh('cuda', (pp, dp, tp), mesh_dim_names=('pp', 'dp', 'tp'))"
        )
    sizes = [int(mesh.size(i)) for i in range(len(names))]
    coords = [int(mesh.get_local_rank(name)) for name in names]
    pp = [i for i, n in enumerate(names) if n in _PP_NAMES]
    tp = [i for i, n in enumerate(names) if n in _TP_NAMES]
    for role, found in (("pipeline", pp), ("tensor-parallel", tp)):
        if len(found) > 1:
            raise ConfigurationError(
                f"device_mesh names {len(found)} {role} dimensions "
                f"({', '.join(names[i] for i in found)}); name one"
            )
    dp_rank, dp_degree = 0, 1
    for i in range(len(names)):
        if i not in pp and i not in tp:
            dp_rank, dp_degree = dp_rank * sizes[i] + coords[i], dp_degree * sizes[i]
    return MeshPlace(
        dp_rank=dp_rank,
        dp_degree=dp_degree,
        pp_rank=coords[pp[0]] if pp else 0,
        pp_degree=sizes[pp[0]] if pp else 1,
        tp_rank=coords[tp[0]] if tp else 0,
        tp_degree=sizes[tp[0]] if tp else 1,
    )


def local_device_id(given: int | None) -> int:
    """This rank's GPU index on its node: `given`, else ``LOCAL_RANK`` (which torchrun
    sets). Without either, a `ConfigurationError`: SLURM and mpirun set no ``LOCAL_RANK``,
    and Perseus does not guess GPU 0."""
    if given is not None:
        return given
    local = os.environ.get("LOCAL_RANK")
    if local is None:
        raise ConfigurationError(
            "set LOCAL_RANK or pass device_id= (this rank's GPU index on its node)"
        )
    try:
        return int(local)
    except ValueError:
        raise ConfigurationError(f"LOCAL_RANK={local!r} is not an integer") from None
