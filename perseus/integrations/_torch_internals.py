"""The torch internals `attach` relies on, checked when it is called, and read in one place.

`torch.distributed.pipelining` has no public API for what `attach` needs: the stages a
schedule holds on this rank, its microbatch count, its action order, whether a step runs
backward, and the stage methods that run one instruction. Those are private names
(`INTERNALS` lists every one), and a torch release may rename any of them. Read with a
default, a renamed flag would silently change what is measured (every ``eval()`` counted
as an iteration, say); read bare, it would fail mid-training with an ``AttributeError``.
So `TorchSchedule.of` checks all of them when `attach` is called and fails with a
`ConfigurationError` naming the torch version and each missing piece, and
`perseus.integrations.pipelining` reads them only through the `TorchSchedule` it returns.

Where torch itself has no such attribute for a schedule class, the view says what torch
does instead, never a guess: a `PipelineScheduleSingle` always needs autograd for its
backward (its ``step`` refuses a training step under ``no_grad``), and only a
`_PipelineScheduleRuntime` can have custom functions registered.

`attach` is verified on torch `VERIFIED_TORCH` only (the only one installable here); tests
pin `INTERNALS` and check each of them against the installed torch. The oldest release it
should support is torch 2.8; that is inferred from torch's history, not run:
the single-stage schedules (`ScheduleGPipe`, `Schedule1F1B`) got their ``pipeline_order``
in June 2025 (pytorch#155935, as ``get_pipeline_order()``, which `attach` also reads; 2.8
if it made that branch cut, else 2.9); ``backward_weight_one_chunk`` and
`ScheduleInterleavedZeroBubble` (2024, 2.5), `ScheduleZBVZeroBubble` and the
`_PipelineScheduleRuntime` (Dec 2024, 2.6) are older; `ScheduleDualPipeV` and
``OVERLAP_F_B`` (Aug 2025) need 2.9. On a release without a schedule's
``pipeline_order``, `attach` fails with an error that says so. torch 2.13's
`Schedule1F1B` numbers its last rank's forwards from 1 in ``pipeline_order`` (it runs
them from 0): `perseus.integrations.orders.renumber_single_stage` repairs that.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from perseus.errors import ConfigurationError

__all__ = ["INTERNALS", "MODULE", "VERIFIED_TORCH", "Internal", "TorchSchedule", "missing"]

MODULE = "torch.distributed.pipelining.schedules"
"""Where torch's schedule classes, `_Action` and `_ComputationType` live."""
VERIFIED_TORCH = "2.13"
"""The torch release `attach` is verified on."""

Kind = Literal["class", "field", "value", "method", "attribute"]


@dataclass(frozen=True)
class Internal:
    """One private piece of torch that `attach` relies on.

    Attributes:
        kind: ``class`` (a class of `MODULE`), ``field`` (of `_Action`), ``value`` (of
            `_ComputationType`), ``method`` (of every local stage, with its leading
            parameters), ``attribute`` (of every schedule of class `owner`; of every schedule
            when `owner` is ``schedule``, of every local stage when it is ``stage``).
        owner: The class the piece belongs to.
        name: Its name.
        use: What `attach` does with it.
        params: [method] Its leading parameters after ``self``, in order.
        alternatives: [attribute] Methods returning the same value when the attribute is
            absent (torch named it differently in earlier releases).
    """

    kind: Kind
    owner: str
    name: str
    use: str
    params: tuple[str, ...] = ()
    alternatives: tuple[str, ...] = ()

    def __str__(self) -> str:
        if self.kind == "class":
            return f"{MODULE}.{self.name}"
        if self.kind == "value":
            return f"{self.owner} value {self.name!r}"
        if self.kind == "method":
            return f"{self.owner}.{self.name}({', '.join(self.params)}, ...)"
        also = "".join(f" or {a}()" for a in self.alternatives)
        return f"{self.owner}.{self.name}{also}"


_SCHEDULE = "schedule"
_SINGLE = "PipelineScheduleSingle"
_MULTI = "PipelineScheduleMulti"
_RUNTIME = "_PipelineScheduleRuntime"

INTERNALS: tuple[Internal, ...] = (
    Internal("class", MODULE, _SINGLE, "tells a schedule with one stage per rank"),
    Internal("class", MODULE, _MULTI, "tells a schedule with several stages per rank"),
    Internal("class", MODULE, "_ScheduleForwardOnly", "tells a forward-only schedule (refused)"),
    Internal("class", MODULE, _RUNTIME, "tells a schedule that may run custom functions"),
    Internal("class", MODULE, "_Action", "one action of pipeline_order"),
    Internal("class", MODULE, "_ComputationType", "the type of an action"),
    Internal("field", "_Action", "stage_index", "an action's stage"),
    Internal("field", "_Action", "computation_type", "an action's type"),
    Internal("field", "_Action", "microbatch_index", "an action's microbatch"),
    Internal("field", "_Action", "sub_actions", "the actions an OVERLAP_F_B runs"),
    *(
        Internal("value", "_ComputationType", letter, "an action type Perseus measures")
        for letter in ("F", "B", "I", "W", "OVERLAP_F_B")
    ),
    Internal("attribute", _SCHEDULE, "_n_microbatches", "the microbatches of one step"),
    Internal("attribute", _SCHEDULE, "_loss_fn", "tells a training schedule (no loss: refused)"),
    Internal("attribute", _SCHEDULE, "_has_backward", "whether a step runs backward"),
    Internal(
        "attribute",
        _SCHEDULE,
        "pipeline_order",
        "each pipeline rank's actions, in order",
        alternatives=("_get_pipeline_order", "get_pipeline_order"),
    ),
    Internal("attribute", _SINGLE, "_stage", "this rank's stage"),
    Internal("attribute", _MULTI, "_stages", "this rank's stages"),
    Internal(
        "attribute",
        _MULTI,
        "_backward_requires_autograd",
        "whether a step under no_grad still runs backward",
    ),
    Internal("attribute", _RUNTIME, "_comp_type_to_function_map", "custom functions (OVERLAP_F_B)"),
    Internal("attribute", "stage", "stage_index", "a stage's index in the pipeline"),
    Internal("attribute", "stage", "num_stages", "the pipeline's stages"),
    Internal("attribute", "stage", "group_rank", "this rank's pipeline rank"),
    Internal("attribute", "stage", "group_size", "the pipeline's ranks"),
    Internal("attribute", "stage", "device", "the GPU this rank drives"),
    Internal("method", "stage", "forward_one_chunk", "wrapped: one forward", ("fwd_chunk_id",)),
    Internal(
        "method",
        "stage",
        "backward_one_chunk",
        "wrapped: one backward; full_backward=False is a backward_input",
        ("bwd_chunk_id", "loss", "full_backward"),
    ),
    Internal("method", "stage", "backward_weight_one_chunk", "wrapped: one W", ("bwd_chunk_id",)),
)
"""Every private piece of `torch.distributed.pipelining` that `attach` relies on."""


def _schedules_module() -> Any:
    from torch.distributed.pipelining import schedules

    return schedules


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def _leading_params(method: Any, count: int) -> tuple[str, ...]:
    try:
        params = list(inspect.signature(method).parameters)
    except (TypeError, ValueError):
        return ()
    return tuple(params[1 : count + 1])


def missing(schedule: Any = None, stages: Sequence[Any] = ()) -> list[Internal]:
    """The pieces of `INTERNALS` the installed torch lacks: its module-level ones, and those
    of `schedule` and its local `stages` when given."""
    module = _schedules_module()
    gone: list[Internal] = []
    for piece in INTERNALS:
        if piece.kind == "class":
            present = isinstance(getattr(module, piece.name, None), type)
        elif piece.kind == "field":
            present = piece.name in getattr(getattr(module, "_Action", None), "_fields", ())
        elif piece.kind == "value":
            kinds = getattr(module, "_ComputationType", ())
            present = piece.name in {getattr(k, "value", None) for k in kinds}
        elif piece.owner == "stage":
            present = all(_stage_has(stage, piece) for stage in stages)
        elif schedule is None:
            continue
        else:  # the owner classes are in INTERNALS: absent, they are reported themselves
            owner = getattr(module, piece.owner, object) if piece.owner != "schedule" else object
            present = (
                not isinstance(schedule, owner)
                or hasattr(schedule, piece.name)
                or any(callable(getattr(schedule, a, None)) for a in piece.alternatives)
            )
        if not present:
            gone.append(piece)
    return gone


def _stage_has(stage: Any, piece: Internal) -> bool:
    if piece.kind == "attribute":
        return hasattr(stage, piece.name)
    method = getattr(type(stage), piece.name, None)
    return callable(method) and _leading_params(method, len(piece.params)) == piece.params


def _refuse(gone: Sequence[Internal], what: str) -> ConfigurationError:
    listed = "; ".join(f"{piece} ({piece.use})" for piece in gone)
    return ConfigurationError(
        f"attach() relies on internals of torch.distributed.pipelining that this torch "
        f"({_torch_version()}) does not have{what}: {listed}. attach() is verified on torch "
        f"{VERIFIED_TORCH}: install that release, or report the missing pieces to Perseus"
    )


@dataclass(frozen=True)
class TorchSchedule:
    """A torch schedule seen through the internals `attach` relies on, all checked.

    Attributes:
        schedule: The schedule.
        stages: This rank's stages (one for a `PipelineScheduleSingle`).
        single: Whether it is a `PipelineScheduleSingle` (one stage per rank).
        forward_only: Whether it is torch's `_ScheduleForwardOnly`.
    """

    schedule: Any
    stages: list[Any]
    single: bool
    forward_only: bool

    @classmethod
    def of(cls, schedule: Any) -> TorchSchedule:
        """Check every piece of `INTERNALS` for `schedule`; a `ConfigurationError` names
        each one missing, or says `schedule` is no torch pipeline schedule."""
        gone = missing()
        if gone:
            raise _refuse(gone, "")
        module = _schedules_module()
        name = type(schedule).__name__
        single = isinstance(schedule, module.PipelineScheduleSingle)
        if not single and not isinstance(schedule, module.PipelineScheduleMulti):
            raise ConfigurationError(
                f"attach() needs a torch.distributed.pipelining schedule (a "
                f"PipelineScheduleSingle or PipelineScheduleMulti), got "
                f"{type(schedule).__module__}.{name}"
            )
        gone = missing(schedule)
        if gone:
            raise _refuse(gone, f" for its {name}")
        stages = [schedule._stage] if single else list(schedule._stages)
        gone = missing(schedule, stages)
        if gone:
            raise _refuse(gone, f" for the stages of its {name}")
        return cls(
            schedule=schedule,
            stages=stages,
            single=single,
            forward_only=isinstance(schedule, module._ScheduleForwardOnly),
        )

    @property
    def n_microbatches(self) -> int:
        return int(self.schedule._n_microbatches)

    @property
    def loss_fn(self) -> Any:
        return self.schedule._loss_fn

    @property
    def has_backward(self) -> bool:
        """Whether a step runs backward (False in ``eval()``)."""
        return bool(self.schedule._has_backward)

    @property
    def backward_requires_autograd(self) -> bool:
        """Whether a training step needs autograd enabled (a `PipelineScheduleSingle`
        always does: its ``step`` refuses a training step under ``no_grad``)."""
        if self.single:
            return True
        return bool(self.schedule._backward_requires_autograd)

    def pipeline_order(self) -> dict[int, list[Any]] | None:
        """torch's per-rank action order (None or empty: the class has none)."""
        if hasattr(self.schedule, "pipeline_order") and self.schedule.pipeline_order:
            return dict(self.schedule.pipeline_order)
        for name in ("_get_pipeline_order", "get_pipeline_order"):  # `INTERNALS`' alternatives
            if callable(getter := getattr(self.schedule, name, None)):
                order = getter()
                return dict(order) if order else None
        return None

    def custom_function_types(self) -> list[str]:
        """The action types with a custom function registered (only a
        `_PipelineScheduleRuntime` can have any)."""
        if not isinstance(self.schedule, _schedules_module()._PipelineScheduleRuntime):
            return []
        return [str(t.value) for t in self.schedule._comp_type_to_function_map]
