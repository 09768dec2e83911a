"""Perseus on Megatron-Core's pipeline schedules in one call.

Megatron-Core runs a training iteration as one call of the function
``get_forward_backward_func()`` returns: ``forward_backward_pipelining_without_interleaving``
(1F1B) or, with a virtual pipeline size, ``forward_backward_pipelining_with_interleaving``
(interleaved 1F1B: each pipeline rank holds several model chunks). Inside, each microbatch's
forward through one chunk is one call of the module-level ``forward_step`` of
``megatron.core.pipeline_parallel.schedules`` and each backward one call of its
``backward_step``. `attach_megatron` returns a drop-in replacement for that function: each
call is a Perseus iteration, and for its duration those two module functions run as Perseus
instructions, checked against the order the job registered (`megatron_spec`: Megatron's own
order, computed as its schedules compute it). A call with ``forward_only=True``
(evaluation) passes through unmeasured.

Usage, after ``parallel_state.initialize_model_parallel``::

    from perseus.integrations.megatron import attach_megatron

    with attach_megatron(num_microbatches=m, server_url="http://coordinator:7787") as fb:
        for step in range(steps):
            losses = fb(forward_step_func=..., data_iterator=..., model=..., num_microbatches=m,
                        seq_length=..., micro_batch_size=..., forward_only=False)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from perseus.client.hook import PerseusOptimizer
from perseus.client.lifecycle import ClosesOnExit
from perseus.client.place import local_device_id
from perseus.domain.schedule import make_schedule
from perseus.errors import ConfigurationError, ScheduleError
from perseus.integrations.iteration import Action, OrderedIteration
from perseus.protocol.jobs import PipelineSpec

__all__ = ["MegatronPipeline", "attach_megatron", "megatron_spec"]

SCHEDULE_NAME = "MegatronCore1F1B"
INTERLEAVED_NAME = "MegatronCoreInterleaved1F1B"


def megatron_spec(
    num_microbatches: int,
    pp_size: int,
    vp_size: int | None = None,
    microbatch_group_size: int | None = None,
) -> PipelineSpec:
    """The `PipelineSpec` of Megatron-Core's pipeline schedule for `pp_size` pipeline ranks,
    `num_microbatches` per iteration and `vp_size` model chunks per rank (None or 1: 1F1B
    without interleaving), chunk ``c`` of rank ``r`` being pipeline stage ``c·pp_size + r``.

    With interleaving, the order is Megatron's (``forward_backward_pipelining_with_interleaving``):
    the virtual microbatches in the order of its ``get_schedule_table`` (groups of
    `microbatch_group_size` microbatches, default `pp_size`, through every chunk), the k-th
    backward through the chunks in reverse; ``(pp_size − rank − 1)·2 + (vp_size −
    1)·microbatch_group_size`` warm-up forwards, then one forward and one backward, then the
    remaining backwards. Without, it is Perseus's 1F1B (Megatron's: pp − rank − 1 warm-up
    forwards)."""
    if vp_size is None or vp_size == 1:
        schedule = make_schedule("1f1b", pp_size, num_microbatches)
        orders = [[(i.stage, i.kind, i.microbatch) for i in order] for order in schedule.orders]
        return PipelineSpec(
            schedule=SCHEDULE_NAME,
            num_stages=pp_size,
            num_microbatches=num_microbatches,
            orders=orders,  # type: ignore[arg-type]
        )
    group = pp_size if microbatch_group_size is None else microbatch_group_size
    if not pp_size <= group <= num_microbatches:
        raise ConfigurationError(
            f"Megatron-Core's interleaved schedule needs pp size ({pp_size}) ≤ microbatch group "
            f"size ({group}) ≤ microbatches ({num_microbatches})"
        )
    table = _schedule_table(num_microbatches, vp_size, group)
    total = len(table)
    orders: list[list[Action]] = []
    for rank in range(pp_size):
        warmup = min((pp_size - rank - 1) * 2 + (vp_size - 1) * group, total)

        def forward(k: int, rank: int = rank) -> Action:
            mb, chunk = table[k]
            return (chunk * pp_size + rank, "forward", mb)

        def backward(k: int, rank: int = rank) -> Action:
            mb, chunk = table[k]
            return ((vp_size - 1 - chunk) * pp_size + rank, "backward", mb)

        order = [forward(k) for k in range(warmup)]
        for i in range(total - warmup):
            order += [forward(warmup + i), backward(i)]
        order += [backward(k) for k in range(total - warmup, total)]
        orders.append(order)
    try:
        return PipelineSpec(
            schedule=INTERLEAVED_NAME,
            num_stages=pp_size * vp_size,
            num_microbatches=num_microbatches,
            num_chunks=vp_size,
            orders=orders,  # type: ignore[arg-type]
        )
    except ValueError as exc:
        raise ScheduleError(f"Megatron-Core's interleaved order cannot be planned: {exc}") from None


def _schedule_table(num_microbatches: int, num_chunks: int, group: int) -> list[tuple[int, int]]:
    """(microbatch, chunk) of each virtual microbatch, as Megatron-Core's
    ``get_schedule_table`` gives them: `group` microbatches through every chunk, then the
    next group (the last group takes every microbatch left)."""
    table: list[tuple[int, int]] = []
    for first in range(0, num_microbatches, group):
        last = num_microbatches if first + group >= num_microbatches else first + group
        table += [(mb, c) for c in range(num_chunks) for mb in range(first, last)]
    return table


class MegatronPipeline(ClosesOnExit):
    """Megatron-Core's forward-backward function with Perseus attached (`attach_megatron`):
    call it as the function it wraps.

    Each ``forward_step`` / ``backward_step`` call is checked against the next action of
    this rank's order: its kind, and for a forward the model chunk it runs (the chunk object
    Megatron passes, found in the call's ``model`` list); a backward's chunk is not passed
    to ``backward_step``, and is the order's."""

    def __init__(
        self,
        forward_backward_func: Callable[..., Any],
        hook: PerseusOptimizer,
        spec: PipelineSpec,
        microbatch_group_size: int | None = None,
    ) -> None:
        self.function = forward_backward_func
        self.hook = hook
        self.spec = spec
        self.rank = hook.pp_rank
        self.pp_size = spec.num_stages // spec.num_chunks
        self.group = self.pp_size if microbatch_group_size is None else microbatch_group_size
        self.order: list[Action] = [(int(s), str(k), int(m)) for s, k, m in spec.orders[self.rank]]
        self.iteration = OrderedIteration(
            hook, self.order, engine="Megatron-Core", order_name="order"
        )
        self._chunks: list[Any] = []
        self._closed = False

    def _action(self, kind: str, chunk: int | None) -> tuple[Action, str | None]:
        """The action a ``forward_step`` / ``backward_step`` call runs: the next one of the
        order where its kind (and, for a forward, its chunk's stage) match, else what the
        call is known to run, for `OrderedIteration.instruction`'s message."""
        due = self.iteration.due
        if due is not None and due[1] == kind and (chunk is None or due[0] == self._stage(chunk)):
            return due, None
        stage = self._stage(chunk) if chunk is not None else -1
        return (stage, kind, -1), (
            f"a {kind} of model chunk {chunk}" if chunk is not None else f"a {kind}"
        )

    def _stage(self, chunk: int) -> int:
        return chunk * self.pp_size + self.rank

    def _chunk_of(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
        """The chunk a ``forward_step(forward_step_func, data_iterator, model, ...)`` runs."""
        model = kwargs["model"] if "model" in kwargs else args[2] if len(args) > 2 else None
        for index, chunk in enumerate(self._chunks):
            if chunk is model:
                return index
        return None

    def _wrapped(self, kind: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def step(*args: Any, **kwargs: Any) -> Any:
            chunk = self._chunk_of(args, kwargs) if kind == "forward" else None
            action, ran = self._action(kind, chunk)
            with self.iteration.instruction(action, ran=ran):
                return original(*args, **kwargs)

        return step

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._closed or kwargs.get("forward_only", False):
            return self.function(*args, **kwargs)
        m = kwargs.get("num_microbatches")
        if m is not None and int(m) != self.spec.num_microbatches:
            raise ConfigurationError(
                f"attached for {self.spec.num_microbatches} microbatches, called with {m}"
            )
        model = kwargs.get("model")
        self._chunks = list(model) if isinstance(model, (list, tuple)) else [model]
        if len(self._chunks) != self.spec.num_chunks:
            raise ConfigurationError(
                f"attached for {self.spec.num_chunks} model chunk(s) per rank, called with "
                f"{len(self._chunks)}"
            )
        config = getattr(self._chunks[0], "config", None)
        group = getattr(config, "microbatch_group_size_per_vp_stage", None)
        if self.spec.num_chunks > 1 and group is not None and int(group) != self.group:
            raise ConfigurationError(
                f"attached for microbatch groups of {self.group} (microbatch_group_size=), the "
                f"model's config has microbatch_group_size_per_vp_stage={group}"
            )
        from megatron.core.pipeline_parallel import schedules

        forward, backward = schedules.forward_step, schedules.backward_step

        def iteration() -> Any:
            schedules.forward_step = self._wrapped("forward", forward)
            schedules.backward_step = self._wrapped("backward", backward)
            try:
                return self.function(*args, **kwargs)
            finally:
                schedules.forward_step, schedules.backward_step = forward, backward

        return self.iteration.run(iteration)

    def close(self, *, finish: bool = True) -> None:
        """Close the hook (`PerseusOptimizer.close`); calls pass through after. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.hook.close(finish=finish)


def attach_megatron(
    *,
    num_microbatches: int,
    server_url: str,
    forward_backward_func: Callable[..., Any] | None = None,
    microbatch_group_size: int | None = None,
    device_id: int | None = None,
    job_metadata: str | None = None,
    **hook_options: Any,
) -> MegatronPipeline:
    """Attach Perseus to Megatron-Core's pipeline schedule (every rank, after
    ``parallel_state.initialize_model_parallel``); the ranks' places and the virtual
    pipeline size come from ``parallel_state``. `microbatch_group_size`: the model config's
    ``microbatch_group_size_per_vp_stage`` where it is set (interleaving only; Megatron's
    default, the pipeline size, otherwise)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func, schedules

    function = forward_backward_func or get_forward_backward_func()
    supported = {
        schedules.forward_backward_pipelining_without_interleaving: False,
        schedules.forward_backward_pipelining_with_interleaving: True,
    }
    if function not in supported:
        raise ConfigurationError(
            "attach_megatron supports Megatron-Core's pipeline schedules (1F1B with or without "
            f"interleaving), not {getattr(function, '__name__', function)}"
        )
    device_id = local_device_id(device_id)
    pp_size = ps.get_pipeline_model_parallel_world_size()
    vp_size = ps.get_virtual_pipeline_model_parallel_world_size() if supported[function] else None
    spec = megatron_spec(num_microbatches, pp_size, vp_size, microbatch_group_size)
    hook = PerseusOptimizer(
        rank=dist.get_rank(),
        dp_rank=ps.get_data_parallel_rank(),
        pp_rank=ps.get_pipeline_model_parallel_rank(),
        tp_rank=ps.get_tensor_model_parallel_rank(),
        device_id=device_id,
        dp_degree=ps.get_data_parallel_world_size(),
        pp_degree=pp_size,
        tp_degree=ps.get_tensor_model_parallel_world_size(),
        world_size=dist.get_world_size(),
        server_url=server_url,
        job_metadata=job_metadata,
        pipeline=spec,
        **hook_options,
    )
    return MegatronPipeline(function, hook, spec, microbatch_group_size)
