"""Where the training job's pieces go: ranks, pipeline stages, layers (no torch needed).

Ranks are laid out pipeline-major: ``rank = (dp_rank · pp_degree + pp_rank) · tp_degree +
tp_rank`` (``dp_rank · pp_degree + pp_rank`` without tensor parallelism); each data-
parallel replica is one pipeline of ``pp_degree`` stages of ``tp_degree`` ranks each. A pipeline has
``pp_degree · chunks`` (virtual) stages: one per rank for the single-stage schedules
(``1f1b``, ``gpipe``), ``chunks`` per rank for the others, placed as torch's schedule
classes expect them:

- looped (``interleaved``, ``zb``, ``looped``): stage ``s`` on pipeline rank ``s mod S``;
- V-shaped (``zbv``): rank ``r`` holds stages ``r`` and ``2S − 1 − r`` (exactly 2 chunks).

``--layers`` gives the transformer layers of every stage (``S · chunks`` counts); for a
multi-stage schedule it may instead give one count per rank (``S`` counts), which is split
over that rank's stages as evenly as possible (earlier stages take the remainder).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from perseus.domain.layout import ParallelLayout
from perseus.errors import ConfigurationError

__all__ = [
    "DEFAULT_CHUNKS",
    "SCHEDULE_CLASSES",
    "PipelineLayout",
    "Topology",
    "is_multi_stage",
    "nominal_times",
]

SCHEDULE_CLASSES: dict[str, str] = {
    "1f1b": "Schedule1F1B",
    "gpipe": "ScheduleGPipe",
    "interleaved": "ScheduleInterleaved1F1B",
    "looped": "ScheduleLoopedBFS",
    "zb": "ScheduleInterleavedZeroBubble",
    "zbv": "ScheduleZBVZeroBubble",
}
"""``--schedule`` → the `torch.distributed.pipelining.schedules` class that runs it."""

DEFAULT_CHUNKS = 2
"""Stages per rank of the multi-stage schedules unless ``--chunks`` says otherwise."""

_SINGLE = ("1f1b", "gpipe")


def is_multi_stage(schedule: str) -> bool:
    """Whether `schedule` puts more than one stage on a rank (a PipelineScheduleMulti)."""
    _check_schedule(schedule)
    return schedule not in _SINGLE


def _check_schedule(schedule: str) -> None:
    if schedule not in SCHEDULE_CLASSES:
        raise ConfigurationError(
            f"--schedule {schedule!r} is not one of {', '.join(SCHEDULE_CLASSES)}"
        )


@dataclass(frozen=True)
class Topology:
    """Where this rank sits: ``rank = (dp_rank · pp_degree + pp_rank) · tp_degree + tp_rank``.

    Tensor parallelism here stands in for a real one: the small model is not sharded, so
    each of a stage's ``tp_degree`` ranks runs the whole stage in a pipeline of its own
    (ranks with the same dp and tp rank), all-reducing its gradients with the ranks of the
    same stage and tensor rank in the other replicas. Perseus sees, and plans for, a
    stage's tensor ranks as it would a real tensor-parallel group's.
    """

    rank: int
    world_size: int
    pp_degree: int
    tp_degree: int = 1

    def __post_init__(self) -> None:
        self.layout.coordinates(self.rank)  # the world size, then the rank, checked once

    @functools.cached_property
    def layout(self) -> ParallelLayout:
        """The job's layout, the value object the hook and the coordinator check
        (`perseus.domain.layout.ParallelLayout`): it numbers the ranks."""
        return ParallelLayout.of_world(
            self.world_size, pp_degree=self.pp_degree, tp_degree=self.tp_degree
        )

    @property
    def dp_degree(self) -> int:
        return self.layout.dp_degree

    @property
    def dp_rank(self) -> int:
        return self.layout.coordinates(self.rank)[0]

    @property
    def pp_rank(self) -> int:
        return self.layout.coordinates(self.rank)[1]

    @property
    def tp_rank(self) -> int:
        return self.layout.coordinates(self.rank)[2]

    def rank_of(self, dp_rank: int, pp_rank: int, tp_rank: int = 0) -> int:
        return self.layout.rank_of(dp_rank, pp_rank, tp_rank)


@dataclass(frozen=True)
class PipelineLayout:
    """One pipeline's stages: which schedule, how many ranks, each stage's layers.

    Attributes:
        schedule: A `SCHEDULE_CLASSES` key.
        pp_degree: Pipeline ranks (S).
        chunks: Stages per rank (V; 1 for the single-stage schedules).
        stage_layers: Transformer layers of each stage, in stage order (S · V counts).
    """

    schedule: str
    pp_degree: int
    chunks: int
    stage_layers: tuple[int, ...]

    @classmethod
    def build(
        cls,
        schedule: str,
        layers: list[int],
        *,
        chunks: int | None = None,
        pp_degree: int | None = None,
    ) -> PipelineLayout:
        """The layout `--schedule`, `--layers`, `--chunks` and `--pp-degree` describe.

        Single-stage schedules: one layer count per rank (``pp_degree`` defaults to their
        number). Multi-stage schedules: `layers` holds ``pp_degree · chunks`` counts, or
        ``pp_degree`` counts to split over each rank's stages (``pp_degree`` defaults to
        ``len(layers)``: one count per rank).
        """
        _check_schedule(schedule)
        if not layers or any(n < 1 for n in layers):
            raise ConfigurationError(f"--layers {layers}: every stage needs at least one layer")
        if schedule in _SINGLE:
            if chunks not in (None, 1):
                raise ConfigurationError(
                    f"--chunks {chunks}: schedule {schedule!r} runs one stage per rank; use "
                    "interleaved, zb, zbv or looped for more"
                )
            if pp_degree is not None and pp_degree != len(layers):
                raise ConfigurationError(
                    f"--layers gives {len(layers)} stage(s) but --pp-degree is {pp_degree}: "
                    f"schedule {schedule!r} runs one stage per pipeline rank"
                )
            return cls(schedule, len(layers), 1, tuple(layers))
        v = DEFAULT_CHUNKS if chunks is None else chunks
        if schedule == "zbv" and v != 2:
            raise ConfigurationError(
                f"--chunks {v}: schedule 'zbv' places exactly 2 stages per rank (a V shape)"
            )
        if v < 1:
            raise ConfigurationError(f"--chunks {v} must be at least 1")
        s = pp_degree if pp_degree is not None else len(layers)
        if s < 1:
            raise ConfigurationError(f"--pp-degree {s} must be at least 1")
        if len(layers) == s * v:
            stage_layers = list(layers)
        elif len(layers) == s:
            stage_layers = cls._split(schedule, layers, s, v)
        else:
            raise ConfigurationError(
                f"--layers gives {len(layers)} count(s); schedule {schedule!r} on {s} pipeline "
                f"rank(s) with {v} stage(s) each needs {s * v} (one per stage) or {s} (one per "
                "rank, split over its stages)"
            )
        return cls(schedule, s, v, tuple(stage_layers))

    @staticmethod
    def _split(schedule: str, layers: list[int], s: int, v: int) -> list[int]:
        out = [0] * (s * v)
        for rank, total in enumerate(layers):
            if total < v:
                raise ConfigurationError(
                    f"--layers: pipeline rank {rank} has {total} layer(s), too few for its {v} "
                    f"stages under schedule {schedule!r}; give at least {v} per rank or one "
                    f"count per stage ({s * v} counts)"
                )
            share, extra = divmod(total, v)
            stages = _stages_of(schedule, rank, s, v)
            for k, stage in enumerate(sorted(stages)):
                out[stage] = share + (1 if k < extra else 0)
        return out

    @property
    def num_stages(self) -> int:
        return self.pp_degree * self.chunks

    def stages_of(self, pp_rank: int) -> list[int]:
        """The stages pipeline rank `pp_rank` holds, in the order torch's schedule takes."""
        return _stages_of(self.schedule, pp_rank, self.pp_degree, self.chunks)

    def rank_layers(self, pp_rank: int) -> int:
        return sum(self.stage_layers[s] for s in self.stages_of(pp_rank))


def _stages_of(schedule: str, pp_rank: int, s: int, v: int) -> list[int]:
    if schedule == "zbv":
        return [pp_rank, 2 * s - 1 - pp_rank]
    return [pp_rank + k * s for k in range(v)]


def nominal_times(layout: PipelineLayout, pp_rank: int, ms_per_layer: float) -> dict[str, float]:
    """Nominal emulation times of this rank's stages, keyed ``"<kind>@<stage>"``.

    A stage's forward takes `ms_per_layer` per layer at the max clock, its full backward
    twice that, its input- and weight-gradient halves (zero-bubble schedules) one forward
    each.
    """
    if not ms_per_layer > 0:
        raise ConfigurationError(f"--nominal-ms-per-layer must be positive, got {ms_per_layer}")
    out: dict[str, float] = {}
    for stage in layout.stages_of(pp_rank):
        forward_s = ms_per_layer / 1000.0 * layout.stage_layers[stage]
        out[f"forward@{stage}"] = forward_s
        out[f"backward@{stage}"] = 2 * forward_s
        out[f"backward_input@{stage}"] = forward_s
        out[f"backward_weight@{stage}"] = forward_s
    return out
