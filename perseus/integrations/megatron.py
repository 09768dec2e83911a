"""Perseus on Megatron-Core's pipeline schedules in one call.

Megatron-Core runs a training iteration as one call of the function
``get_forward_backward_func()`` returns (here the 1F1B schedule without interleaving,
``forward_backward_pipelining_without_interleaving``); inside, each microbatch's forward is
one call of the module-level ``forward_step`` of ``megatron.core.pipeline_parallel.schedules``
and each backward one call of its ``backward_step``. `attach_megatron` returns a drop-in
replacement for that function: each call is a Perseus iteration, and for its duration those
two module functions run as Perseus instructions, checked against the order the job
registered (Perseus's 1F1B, which is Megatron's: pp − rank − 1 warm-up forwards, then one
forward and one backward, then the remaining backwards). A call with ``forward_only=True``
(evaluation) passes through unmeasured.

Usage, after ``parallel_state.initialize_model_parallel``::

    from perseus.integrations.megatron import attach_megatron

    with attach_megatron(num_microbatches=m, server_url="http://coordinator:7787") as fb:
        for step in range(steps):
            losses = fb(forward_step_func=..., data_iterator=..., model=..., num_microbatches=m,
                        seq_length=..., micro_batch_size=..., forward_only=False)
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

from perseus.client.hook import PerseusOptimizer
from perseus.client.lifecycle import ClosesOnExit
from perseus.domain.schedule import make_schedule
from perseus.errors import ConfigurationError, ScheduleError
from perseus.protocol.jobs import PipelineSpec

__all__ = ["MegatronPipeline", "attach_megatron", "megatron_spec"]

Action = tuple[int, str, int]
SCHEDULE_NAME = "MegatronCore1F1B"


def megatron_spec(num_microbatches: int, pp_size: int) -> PipelineSpec:
    """The `PipelineSpec` of Megatron-Core's 1F1B without interleaving."""
    schedule = make_schedule("1f1b", pp_size, num_microbatches)
    orders = [[(i.stage, i.kind, i.microbatch) for i in order] for order in schedule.orders]
    return PipelineSpec(
        schedule=SCHEDULE_NAME,
        num_stages=pp_size,
        num_microbatches=num_microbatches,
        orders=orders,  # type: ignore[arg-type]
    )


class MegatronPipeline(ClosesOnExit):
    """Megatron-Core's forward-backward function with Perseus attached (`attach_megatron`):
    call it as the function it wraps."""

    def __init__(
        self, forward_backward_func: Callable[..., Any], hook: PerseusOptimizer, spec: PipelineSpec
    ) -> None:
        self.function = forward_backward_func
        self.hook = hook
        self.spec = spec
        self.stage = hook.pp_rank
        self.order: list[Action] = [(int(s), str(k), int(m)) for s, k, m in spec.orders[self.stage]]
        self._next = 0
        self._count = {"forward": 0, "backward": 0}
        self._closed = False

    @contextlib.contextmanager
    def _instruction(self, kind: str) -> Iterator[None]:
        action = (self.stage, kind, self._count[kind])
        k = self._next
        if k >= len(self.order) or self.order[k] != action:
            due = self.order[k] if k < len(self.order) else "nothing more"
            raise ScheduleError(
                f"Rank {self.hook.rank} (pipeline rank {self.stage}), step {self.hook.step}: "
                f"Megatron-Core executed {action} as action #{k}, but its 1F1B order says {due}"
            )
        self.hook.on_instruction_begin(kind, stage=self.stage, microbatch=action[2])
        yield
        self.hook.on_instruction_end(kind)
        self._count[kind] += 1
        self._next += 1

    def _wrapped(self, kind: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def step(*args: Any, **kwargs: Any) -> Any:
            with self._instruction(kind):
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
        from megatron.core.pipeline_parallel import schedules

        forward, backward = schedules.forward_step, schedules.backward_step
        self.hook.on_step_begin()
        self._next, self._count = 0, {"forward": 0, "backward": 0}
        schedules.forward_step = self._wrapped("forward", forward)
        schedules.backward_step = self._wrapped("backward", backward)
        try:
            out = self.function(*args, **kwargs)
            if self._next != len(self.order):
                raise ScheduleError(
                    f"Rank {self.hook.rank}: the call ran {self._next} of the "
                    f"{len(self.order)} compute actions of its 1F1B order"
                )
        except BaseException:
            self.hook.abort_step()
            raise
        finally:
            schedules.forward_step, schedules.backward_step = forward, backward
        self.hook.on_step_end()
        return out

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
    device_id: int | None = None,
    job_metadata: str | None = None,
    **hook_options: Any,
) -> MegatronPipeline:
    """Attach Perseus to Megatron-Core's pipeline schedule (every rank, after
    ``parallel_state.initialize_model_parallel``); the ranks' places come from
    ``parallel_state``. Only the schedule without interleaving is supported so far."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func, schedules

    function = forward_backward_func or get_forward_backward_func()
    if function is not schedules.forward_backward_pipelining_without_interleaving:
        raise ConfigurationError(
            f"attach_megatron supports forward_backward_pipelining_without_interleaving, "
            f"not {getattr(function, '__name__', function)} (a virtual pipeline size set?)"
        )
    if device_id is None:
        local = os.environ.get("LOCAL_RANK")
        if local is None:
            raise ConfigurationError("set LOCAL_RANK or pass device_id= (this rank's GPU)")
        device_id = int(local)
    pp_size = ps.get_pipeline_model_parallel_world_size()
    spec = megatron_spec(num_microbatches, pp_size)
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
    return MegatronPipeline(function, hook, spec)
