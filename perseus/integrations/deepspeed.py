"""Perseus on DeepSpeed's `PipelineEngine` in one call.

DeepSpeed runs a pipeline as an instruction stream: its `TrainSchedule` yields, per step,
``LoadMicroBatch``, ``ForwardPass``, ``BackwardPass``, send/receive and, at the end,
``ReduceGrads`` and ``OptimizerStep``; `PipelineEngine._exec_schedule` looks each one up in
the class-level ``_INSTRUCTION_MAP`` and runs it. `attach_deepspeed` gives the engine its
own map (the class's is untouched) whose ``ForwardPass`` and ``BackwardPass`` run as Perseus
instructions, and wraps ``train_batch`` as the iteration, so that Perseus sees exactly what
the engine executes and checks it against the order it registered (that of DeepSpeed's own
`TrainSchedule`, one stage per pipeline rank).

Usage, after ``deepspeed.initialize`` returned a `PipelineEngine`::

    from perseus.integrations.deepspeed import attach_deepspeed

    with attach_deepspeed(engine, server_url="http://coordinator:7787"):
        for step in range(steps):
            engine.train_batch(data_iter)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from perseus.client.hook import PerseusOptimizer
from perseus.client.lifecycle import ClosesOnExit
from perseus.client.place import local_device_id
from perseus.errors import ConfigurationError, ScheduleError
from perseus.integrations.iteration import Action, OrderedIteration
from perseus.protocol.jobs import PipelineSpec

__all__ = ["DeepSpeedAttachment", "attach_deepspeed", "deepspeed_spec"]

SCHEDULE_NAME = "DeepSpeedTrainSchedule"


def deepspeed_spec(micro_batches: int, stages: int) -> PipelineSpec:
    """The `PipelineSpec` of DeepSpeed's `TrainSchedule` (1F1B) for `stages` pipeline
    stages and `micro_batches` per iteration: each stage's forwards and backwards in the order
    its own `TrainSchedule` yields them (the k-th forward and the k-th backward of a stage are
    microbatch k: the schedule runs them in order)."""
    from deepspeed.runtime.pipe import schedule as ds_schedule

    orders: list[list[Action]] = []
    for stage in range(stages):
        order: list[Action] = []
        count = {"forward": 0, "backward": 0}
        sched = ds_schedule.TrainSchedule(
            micro_batches=micro_batches, stages=stages, stage_id=stage
        )
        for step in sched:
            for cmd in step:
                kind = _kind(cmd, ds_schedule)
                if kind is not None:
                    order.append((stage, kind, count[kind]))
                    count[kind] += 1
        orders.append(order)
    try:
        return PipelineSpec(
            schedule=SCHEDULE_NAME,
            num_stages=stages,
            num_microbatches=micro_batches,
            orders=orders,  # type: ignore[arg-type]
        )
    except ValueError as exc:
        raise ScheduleError(f"DeepSpeed's TrainSchedule cannot be planned: {exc}") from None


def _kind(cmd: Any, ds_schedule: Any) -> str | None:
    if isinstance(cmd, ds_schedule.ForwardPass):
        return "forward"
    if isinstance(cmd, ds_schedule.BackwardPass):
        return "backward"
    return None


class DeepSpeedAttachment(ClosesOnExit):
    """Perseus attached to one rank's `PipelineEngine` (see `attach_deepspeed`).

    Attributes:
        engine: The engine, with its own ``_INSTRUCTION_MAP`` and ``train_batch``.
        hook: This rank's `PerseusOptimizer`.
        spec: The pipeline the job registered.
        order: This rank's compute actions of one iteration.
    """

    def __init__(self, engine: Any, hook: PerseusOptimizer, spec: PipelineSpec) -> None:
        from deepspeed.runtime.pipe import schedule as ds_schedule

        self.engine = engine
        self.hook = hook
        self.spec = spec
        self.stage = int(engine.stage_id)
        self.order: list[Action] = [(int(s), str(k), int(m)) for s, k, m in spec.orders[self.stage]]
        self.iteration = OrderedIteration(
            hook, self.order, engine="DeepSpeed", order_name="TrainSchedule"
        )
        self._count = {"forward": 0, "backward": 0}  # of this iteration: the microbatch
        self._closed = False
        had = "_INSTRUCTION_MAP" in vars(engine)
        self._saved = (had, vars(engine).get("_INSTRUCTION_MAP"), vars(engine).get("train_batch"))
        table = dict(type(engine)._INSTRUCTION_MAP)
        for cls, kind in (
            (ds_schedule.ForwardPass, "forward"),
            (ds_schedule.BackwardPass, "backward"),
        ):
            table[cls] = self._instruction_fn(kind, table[cls])
        engine._INSTRUCTION_MAP = table
        engine.train_batch = self._train_batch(engine.train_batch)

    def _instruction_fn(self, kind: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def run(engine: Any, **kwargs: Any) -> Any:
            # The k-th forward (backward) of a stage's TrainSchedule is microbatch k.
            with self.iteration.instruction((self.stage, kind, self._count[kind])):
                out = original(engine, **kwargs)
            self._count[kind] += 1
            return out

        return run

    def _train_batch(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def train_batch(*args: Any, **kwargs: Any) -> Any:
            if self._closed:
                return original(*args, **kwargs)
            self._count = {"forward": 0, "backward": 0}
            return self.iteration.run(lambda: original(*args, **kwargs))

        return train_batch

    def close(self, *, finish: bool = True) -> None:
        """Give the engine back its class's instruction map and ``train_batch``, close the
        hook (`PerseusOptimizer.close`). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.iteration.measuring = False
        try:
            had, table, train_batch = self._saved
            if had:
                self.engine._INSTRUCTION_MAP = table
            else:
                vars(self.engine).pop("_INSTRUCTION_MAP", None)
            if train_batch is None:
                vars(self.engine).pop("train_batch", None)
            else:
                self.engine.train_batch = train_batch
        finally:
            self.hook.close(finish=finish)


def attach_deepspeed(
    engine: Any,
    *,
    server_url: str,
    device_id: int | None = None,
    job_metadata: str | None = None,
    **hook_options: Any,
) -> DeepSpeedAttachment:
    """Attach Perseus to a DeepSpeed `PipelineEngine` (call it on every rank, after
    ``deepspeed.initialize``). The pipeline and data-parallel place come from the engine's
    grid; `device_id` defaults to ``LOCAL_RANK`` (no guess of GPU 0 without it)."""
    import torch.distributed as dist

    if getattr(engine, "is_pipe_parallel", False) is not True or not hasattr(engine, "stage_id"):
        raise ConfigurationError("attach_deepspeed needs a PipelineEngine (a PipelineModule)")
    device_id = local_device_id(device_id)
    grid = engine.grid
    model_parallel = int(getattr(grid, "model_parallel_size", 1))
    if model_parallel > 1:
        raise ConfigurationError(
            f"attach_deepspeed supports pipeline and data parallelism; this engine's grid also "
            f"has model parallelism of {model_parallel} (not supported yet)"
        )
    spec = deepspeed_spec(int(engine.micro_batches), int(engine.num_stages))
    hook = PerseusOptimizer(
        rank=dist.get_rank(),
        dp_rank=int(grid.data_parallel_id),
        pp_rank=int(engine.stage_id),
        tp_rank=0,
        device_id=device_id,
        dp_degree=int(grid.data_parallel_size),
        pp_degree=int(engine.num_stages),
        tp_degree=1,
        world_size=dist.get_world_size(),
        server_url=server_url,
        job_metadata=job_metadata,
        pipeline=spec,
        **hook_options,
    )
    try:
        return DeepSpeedAttachment(engine, hook, spec)
    except BaseException:
        hook.close(finish=False)
        raise
