"""Perseus inside `torch.distributed.pipelining`: one call, unchanged training code.

```python
from perseus.integrations.pipelining import attach

schedule = ScheduleInterleavedZeroBubble(stages, n_microbatches=8, loss_fn=loss_fn)
perseus = attach(schedule, server_url="http://coordinator:7787")  # registers, wraps
for x, y in loader:
    schedule.step(x, target=y)        # unchanged user code; each call is one iteration
perseus.close()                       # also a context manager; restores GPU clocks
```

`attach` reads the schedule's local stages, its microbatch count and torch's own action
order (``schedule.pipeline_order``: per pipeline rank, its compute actions F, B, I, W with
their stage and microbatch; bubbles and UNSHARD / RESHARD / REDUCE_GRAD / SEND / RECV
actions are left out), registers the job with that order (a `PipelineSpec`, so the
coordinator plans for exactly the pipeline torch runs) and wraps, on this rank's stage
objects only (instance attributes, no class is patched):

- ``forward_one_chunk`` as instruction ``forward``,
- ``backward_one_chunk`` as ``backward`` (``full_backward=True``) or ``backward_input``
  (``full_backward=False``, the zero-bubble schedules' I),
- ``backward_weight_one_chunk`` as ``backward_weight`` (W),
- ``schedule.step`` as one iteration.

In torch 2.13 the schedules wait for their point-to-point receives *before* calling these
methods and start their sends *after* them, so each instruction's window holds its
computation only (a data-parallel gradient all-reduce that torch starts inside the last
backward of a stage stays in that backward). Every wrapped call is checked against this
rank's order: executing anything else than the next action of ``pipeline_order`` is a
`ScheduleError` naming both actions, and a step that ends with actions left over is one too.

Schedules: every schedule class of torch 2.13 works: `ScheduleGPipe`, `Schedule1F1B`,
`ScheduleInterleaved1F1B`, `ScheduleLoopedBFS`, `ScheduleInterleavedZeroBubble`,
`ScheduleZBVZeroBubble`, and `ScheduleDualPipeV` as torch runs it by default: its
``OVERLAP_F_B`` actions are run by torch's runtime one sub-action after the other, so they
are flattened into their forward and backward. A schedule with a custom function
registered for ``OVERLAP_F_B`` (a real overlap of a forward and a backward) is refused: two
computations that run at the same time on one GPU cannot each get their own clock, nor
their own time and energy measurement. Forward-only schedules (`_ScheduleForwardOnly`, or
no ``loss_fn``) are refused, since Perseus plans training iterations; ``schedule.eval(...)``
(and any step run without backward) passes through unmeasured and does not count as an
iteration. A schedule class without a ``pipeline_order`` is refused with a clear error.

torch versions: what `attach` reads of torch is private; every such piece is checked when
`attach` is called (`perseus.integrations._torch_internals`, which also says which torch
releases it should support), and the order translation is `perseus.integrations.orders`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

from perseus.client.hook import PerseusOptimizer
from perseus.client.lifecycle import ClosesOnExit
from perseus.client.place import mesh_place
from perseus.errors import ConfigurationError, ScheduleError
from perseus.integrations._torch_internals import TorchSchedule
from perseus.integrations.iteration import OrderedIteration
from perseus.integrations.orders import (
    Action,
    action_name,
    compute_orders,
    renumber_single_stage,
)
from perseus.protocol import PipelineSpec

__all__ = [
    "PipelineAttachment",
    "attach",
    "compute_orders",
    "pipeline_spec",
    "renumber_single_stage",
]

_WRAPPED = "__perseus_wrapped__"


def _local_stages(schedule: Any) -> list[Any]:
    view = TorchSchedule.of(schedule)
    name = type(schedule).__name__
    if view.forward_only:
        raise ConfigurationError(
            f"{name} is forward-only: Perseus plans training iterations (forward and "
            "backward); run inference without attach()"
        )
    if not view.stages:
        raise ConfigurationError(f"{name} holds no stage on this rank")
    if view.loss_fn is None:
        raise ConfigurationError(
            f"{name} has no loss_fn, so its steps run forward only: Perseus plans training "
            "iterations (forward and backward); pass loss_fn=... to the schedule"
        )
    return view.stages


def _pipeline_order(schedule: Any) -> dict[int, list[Any]]:
    view = TorchSchedule.of(schedule)
    name = type(schedule).__name__
    order = view.pipeline_order()
    if not order:
        raise ConfigurationError(
            f"{name} has no pipeline_order (torch's per-rank list of actions), so Perseus "
            "cannot tell which instructions each rank runs, in which order: give the class a "
            "pipeline_order (subclasses of PipelineScheduleSingle: implement "
            "_get_pipeline_order(); torch's own single-stage schedules have one since torch 2.8)"
        )
    if "OVERLAP_F_B" in view.custom_function_types():
        raise ConfigurationError(
            f"{name} has a custom function registered for OVERLAP_F_B, which runs a forward "
            "and a backward at the same time on one GPU: they cannot each get their own "
            "clock, nor their own time and energy measurement, so Perseus cannot plan them. "
            "Without the custom function torch runs them one after the other, which Perseus "
            "supports"
        )
    return order


def _process_group() -> tuple[int, int]:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise ConfigurationError(
            "attach() needs an initialised torch.distributed process group: call "
            "torch.distributed.init_process_group(...) before building the schedule"
        )
    return dist.get_rank(), dist.get_world_size()


def _rank_device(stages: list[Any], device_id: int | None, gpu: Any) -> int:
    """This rank's GPU index, from what tells it, never a guess: `device_id` when given, else
    the index of the `gpu` object given, else the CUDA device the rank's stages run on
    (``torch.cuda.current_device()`` for a bare ``cuda``), else ``LOCAL_RANK`` (stages on the
    CPU: emulated GPUs). A launcher other than torchrun (SLURM, mpirun) sets no
    ``LOCAL_RANK``: with CPU stages and nothing else, every rank of a node would take GPU 0,
    so that is refused."""
    import torch

    cuda = [torch.device(stage.device) for stage in stages]
    cuda = [d for d in cuda if d.type == "cuda"]
    on = sorted({torch.cuda.current_device() if d.index is None else d.index for d in cuda})
    if len(on) > 1:
        raise ConfigurationError(
            f"this rank's stages are on GPUs {on}: Perseus drives one GPU per rank (one clock "
            "per instruction); build every stage of a rank on the same GPU"
        )
    if device_id is None and gpu is not None:
        device_id = int(gpu.index)
    if device_id is not None:
        if on and on != [device_id]:
            raise ConfigurationError(
                f"attach() was given GPU {device_id}, but this rank's stages run on cuda:{on[0]}"
            )
        return device_id
    if on:
        return on[0]
    local = os.environ.get("LOCAL_RANK")
    if local is None:
        where = sorted({str(stage.device) for stage in stages})
        raise ConfigurationError(
            f"attach() cannot tell which GPU this rank drives: its stages are on {where} and "
            "LOCAL_RANK is not set (a launcher other than torchrun, such as SLURM or mpirun). "
            "Build the stages on the rank's CUDA device, pass device_id=<this rank's GPU "
            "index on its node>, or set LOCAL_RANK"
        )
    try:
        return int(local)
    except ValueError:
        raise ConfigurationError(f"LOCAL_RANK={local!r} is not an integer") from None


class PipelineAttachment(ClosesOnExit):
    """Perseus attached to one rank's `torch.distributed.pipelining` schedule (see `attach`).

    Attributes:
        schedule: The wrapped schedule.
        hook: This rank's `PerseusOptimizer`.
        spec: The pipeline the job registered (torch's order, compute actions only).
        order: This rank's compute actions of one iteration, ``(stage, kind, microbatch)``.
    """

    def __init__(self, schedule: Any, hook: PerseusOptimizer, spec: PipelineSpec) -> None:
        self.schedule = schedule
        self.hook = hook
        self.spec = spec
        self.order: list[Action] = [
            (int(s), str(k), int(m)) for s, k, m in spec.orders[hook.pp_rank]
        ]
        self._torch = TorchSchedule.of(schedule)
        self._stages = self._torch.stages
        self.iteration = OrderedIteration(
            hook,
            self.order,
            engine=type(schedule).__name__,
            order_name="pipeline_order",
            describe=action_name,
        )
        self._closed = False
        self._saved: list[tuple[Any, str, bool, Any]] = []
        self._wrap()

    # ------------------------------------------------------------------ wrapping
    def _set(self, obj: Any, attr: str, wrapper: Callable[..., Any]) -> None:
        had = attr in vars(obj)
        self._saved.append((obj, attr, had, vars(obj).get(attr)))
        setattr(wrapper, _WRAPPED, True)
        setattr(obj, attr, wrapper)

    def _wrap(self) -> None:
        for stage in self._stages:
            index = int(stage.stage_index)
            forward, backward = stage.forward_one_chunk, stage.backward_one_chunk
            weight = stage.backward_weight_one_chunk
            self._set(stage, "forward_one_chunk", self._forward(index, forward))
            self._set(stage, "backward_one_chunk", self._backward(index, backward))
            self._set(stage, "backward_weight_one_chunk", self._weight(index, weight))
        self._set(self.schedule, "step", self._step(self.schedule.step))

    def _unwrap(self) -> None:
        saved, self._saved = self._saved, []
        for obj, attr, had, value in reversed(saved):
            if had:
                setattr(obj, attr, value)
            else:
                vars(obj).pop(attr, None)

    def _forward(self, stage: int, original: Callable[..., Any]) -> Callable[..., Any]:
        def forward_one_chunk(fwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
            with self._instruction((stage, "forward", int(fwd_chunk_id))):
                return original(fwd_chunk_id, *args, **kwargs)

        return forward_one_chunk

    def _backward(self, stage: int, original: Callable[..., Any]) -> Callable[..., Any]:
        def backward_one_chunk(bwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
            # torch's signature: (bwd_chunk_id, loss=None, full_backward=True, last_backward=False)
            full = (
                kwargs["full_backward"]
                if "full_backward" in kwargs
                else (args[1] if len(args) > 1 else True)
            )
            kind = "backward" if full else "backward_input"
            with self._instruction((stage, kind, int(bwd_chunk_id))):
                return original(bwd_chunk_id, *args, **kwargs)

        return backward_one_chunk

    def _weight(self, stage: int, original: Callable[..., Any]) -> Callable[..., Any]:
        def backward_weight_one_chunk(bwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
            with self._instruction((stage, "backward_weight", int(bwd_chunk_id))):
                return original(bwd_chunk_id, *args, **kwargs)

        return backward_weight_one_chunk

    def _instruction(self, action: Action) -> contextlib.AbstractContextManager[None]:
        return self.iteration.instruction(action)

    def _step(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def step(*args: Any, **kwargs: Any) -> Any:
            if self._closed or not self._trains():  # eval(), a step without backward
                return original(*args, **kwargs)
            return self.iteration.run(
                lambda: original(*args, **kwargs),
                missing_hint=(
                    " (a custom function registered for a compute action may bypass the "
                    "stage's *_one_chunk methods)"
                ),
            )

        return step

    def _trains(self) -> bool:
        """Whether this step runs backward (eval() and no-grad steps pass through)."""
        import torch

        if not self._torch.has_backward:
            return False
        # A training step under no_grad: torch refuses it itself; the hook stays untouched.
        return torch.is_grad_enabled() or not self._torch.backward_requires_autograd

    # ------------------------------------------------------------------ lifecycle
    def close(self, *, finish: bool = True) -> None:
        """Unwrap the schedule and its stages, close the hook (restores the GPU's clocks;
        `finish`: training ended normally, the coordinator lists the job as finished; see
        `PerseusOptimizer.close`). Idempotent. Leaving ``with attach(...)`` follows
        `perseus.client.lifecycle`: on an exception, ``close(finish=False)``, and an error
        while closing is logged, never raised over the original one."""
        if self._closed:
            return
        self._closed = True
        self.iteration.measuring = False
        try:
            self._unwrap()
        finally:
            self.hook.close(finish=finish)


def pipeline_spec(schedule: Any) -> PipelineSpec:
    """The `PipelineSpec` of a torch schedule: its class name, stages, microbatches, chunks
    per rank and each pipeline rank's compute actions from ``pipeline_order``."""
    stages = _local_stages(schedule)
    view = TorchSchedule.of(schedule)
    name = type(schedule).__name__
    num_ranks = int(stages[0].group_size)
    orders = compute_orders(_pipeline_order(schedule), num_ranks, where=name)
    if view.single:
        orders = renumber_single_stage(orders, view.n_microbatches)
    try:
        return PipelineSpec(
            schedule=name,
            num_stages=int(stages[0].num_stages),
            num_microbatches=view.n_microbatches,
            num_chunks=len(stages),
            orders=orders,  # type: ignore[arg-type]
        )
    except ValueError as exc:  # pydantic's ValidationError: a bad order from torch
        raise ScheduleError(f"{name}'s pipeline_order cannot be planned: {exc}") from None


def attach(
    schedule: Any,
    *,
    server_url: str,
    dp_rank: int | None = None,
    dp_degree: int | None = None,
    tp_rank: int | None = None,
    tp_degree: int | None = None,
    device_mesh: Any = None,
    device_id: int | None = None,
    job_metadata: str | None = None,
    **hook_options: Any,
) -> PipelineAttachment:
    """Attach Perseus to a `torch.distributed.pipelining` schedule (call it on every rank).

    Registers the job with the schedule's own action order and wraps this rank's stages and
    ``schedule.step`` (see the module's documentation). Needs an initialised
    ``torch.distributed`` process group; the pipeline rank and degree come from the
    schedule's stages, the global rank and world size from ``torch.distributed``.

    Only the job's leaders talk to the coordinator (one per pipeline stage by default:
    `perseus.client.wire.leaders`); the others get their schedules from them in-job. The leaders
    follow from the layout: the data- and tensor-parallel place given here, or read from
    `device_mesh`.

    Args:
        schedule: The schedule object (any schedule class of torch 2.13, with a ``loss_fn``).
        server_url: The coordinator, e.g. ``http://coordinator:7787``.
        dp_rank, dp_degree, tp_rank, tp_degree: This rank's data- and tensor-parallel place
            (default: from `device_mesh`, else 0 of 1: no data or tensor parallelism).
        device_mesh: The job's ``torch.distributed.DeviceMesh`` with named dimensions: ``pp``
            (checked against the schedule's stages), ``tp``, and any others (``dp``,
            ``dp_shard``, ...), which count as data-parallel (`perseus.client.place.mesh_place`).
        device_id: This rank's GPU index on its node (default: the ``gpu`` given's index,
            else the CUDA device of this rank's stages, else ``LOCAL_RANK`` for stages on the
            CPU; with none of these, a `ConfigurationError`: SLURM and mpirun set no
            ``LOCAL_RANK``, and Perseus does not guess GPU 0).
        job_metadata: Free text appended to the job id.
        **hook_options: Passed to `PerseusOptimizer` (``steps_per_round``, ``trace_dir``,
            ``gpu``, ``emulation``, ``timeout_s``, ``token`` (default ``PERSEUS_TOKEN``),
            ``leaders_per_stage``, ...).

    Returns:
        A `PipelineAttachment`: ``close()`` it (or use it as a context manager) when
        training ends.
    """
    reserved_names = ("pipeline", "expected_instructions", "rank", "pp_rank", "pp_degree")
    for reserved in (*reserved_names, "world_size"):
        if reserved in hook_options:
            raise ConfigurationError(
                f"attach() sets {reserved} itself from the schedule; do not pass it"
            )
    if getattr(getattr(schedule, "step", None), _WRAPPED, False):
        raise ConfigurationError("Perseus is already attached to this schedule; close() it first")
    spec = pipeline_spec(schedule)
    stages = _local_stages(schedule)
    rank, world_size = _process_group()
    pp_rank, pp_degree = int(stages[0].group_rank), int(stages[0].group_size)
    if device_mesh is not None:
        place = mesh_place(device_mesh)
        if (place.pp_rank, place.pp_degree) != (pp_rank, pp_degree):
            raise ConfigurationError(
                f"device_mesh puts this rank at pipeline rank {place.pp_rank} of "
                f"{place.pp_degree}, but its schedule's stages are at {pp_rank} of {pp_degree}: "
                "name the mesh's pipeline dimension 'pp' and build the stages over it"
            )
        dp_rank = place.dp_rank if dp_rank is None else dp_rank
        dp_degree = place.dp_degree if dp_degree is None else dp_degree
        tp_rank = place.tp_rank if tp_rank is None else tp_rank
        tp_degree = place.tp_degree if tp_degree is None else tp_degree
    device_id = _rank_device(stages, device_id, hook_options.get("gpu"))
    hook = PerseusOptimizer(
        rank=rank,
        dp_rank=0 if dp_rank is None else dp_rank,
        pp_rank=pp_rank,
        tp_rank=0 if tp_rank is None else tp_rank,
        device_id=device_id,
        dp_degree=1 if dp_degree is None else dp_degree,
        pp_degree=pp_degree,
        tp_degree=1 if tp_degree is None else tp_degree,
        world_size=world_size,
        server_url=server_url,
        job_metadata=job_metadata,
        pipeline=spec,
        device_mesh=device_mesh,
        **hook_options,
    )
    try:
        return PipelineAttachment(schedule, hook, spec)
    except BaseException:
        hook.close(finish=False)  # nothing trained: the job did not finish
        raise
