"""The hook's keyword options (`HookOptions`), checked once when the hook is built.

`PerseusOptimizer` keeps Zeus's positional signature for the layout and the coordinator;
everything else is one of these keyword-only options. Those that default to the
environment (`timing`, `token`, `trace_dir`, `emulation`) fall back to `ClientSettings`
(`perseus.client.settings`), which reads it once.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from perseus.client.settings import ClientSettings, EmulationSettings
from perseus.errors import ConfigurationError
from perseus.protocol import PipelineSpec
from zeus_power.device.base import GPU

__all__ = ["HookKeywords", "HookOptions"]


class HookKeywords(TypedDict, total=False):
    """The hook's keyword options as a type checker sees ``**options`` (each field is
    documented in `HookOptions`; a test keeps the two lists equal)."""

    steps_per_round: int
    timeout_s: float
    round_timeout_s: float
    gpu: GPU | None
    emulation: EmulationSettings | None
    nominal_time_s: dict[str, float] | None
    expected_instructions: Sequence[str] | None
    pipeline: PipelineSpec | None
    trace_dir: str | os.PathLike[str] | None
    sync: Callable[[], None] | None
    timing: str | None
    token: str | None
    leaders_per_stage: int
    device_mesh: Any
    settings: ClientSettings | None
    connect: bool


@dataclass(frozen=True, kw_only=True)
class HookOptions:
    """The hook's keyword options.

    Attributes:
        steps_per_round: Iterations run with each schedule before reporting (≥ 1).
        timeout_s: Timeout of every request but the schedule long-poll (seconds, > 0).
        round_timeout_s: Read timeout of the schedule long-poll; keep it above the
            coordinator's round timeout so that the coordinator's 504 (which names the
            missing ranks) arrives first.
        gpu: Use this GPU instead of opening `device_id`.
        emulation: Emulation mode for a GPU with a `stand_in` (default: from
            ``PERSEUS_EMULATE_*``).
        nominal_time_s: Instruction name → nominal time at the max clock (nominal emulation).
        expected_instructions: This stage's instruction names for one iteration, in
            execution order; a schedule that differs is rejected as soon as it arrives
            (default: this rank's order in `pipeline`, if given).
        pipeline: The pipeline the job runs (`PipelineSpec`: each pipeline rank's order of
            ``(stage, kind, microbatch)``); the job's first leader sends it when it
            registers the job, so the coordinator plans for exactly this pipeline. Default:
            the coordinator's own (its scheduler arguments).
            `perseus.integrations.pipelining.attach` passes torch's schedule here.
        trace_dir: Write ``rank{R}.jsonl`` here (default: ``PERSEUS_TRACE_DIR``, if set).
        sync: Device synchronisation before each measurement (default: CUDA's, if any).
        timing: How instructions are timed (`perseus.client.gpu.timing`): ``"sync"``,
            ``"events"`` (real CUDA GPUs with an energy counter only) or ``"auto"``:
            events where they can run, else sync. Default: ``PERSEUS_TIMING``, else auto.
        token: The coordinator's token (default: ``PERSEUS_TOKEN``, if set), sent with
            every request. The job's first leader passes the job's credential, which the
            coordinator answers when it registers the job, to the other ranks with the id.
        leaders_per_stage: Leaders per pipeline stage (default 1; at most dp_degree): the
            data-parallel replicas are cut into that many blocks, and the tensor-rank-0
            process of each block's first replica talks for the block.
        device_mesh: The job's ``torch.distributed.DeviceMesh``, if it has one: this
            rank's dp, pp and tp coordinates and degrees are read from its named dimensions
            (`perseus.client.place.mesh_place`) and must agree with the ones given.
        settings: The client's settings (default: `ClientSettings.load()`, the environment).
        connect: Call `PerseusOptimizer.connect` at the end of the constructor (default).
    """

    steps_per_round: int = 1
    timeout_s: float = 30.0
    round_timeout_s: float = 180.0
    gpu: GPU | None = None
    emulation: EmulationSettings | None = None
    nominal_time_s: dict[str, float] | None = None
    expected_instructions: Sequence[str] | None = None
    pipeline: PipelineSpec | None = None
    trace_dir: str | os.PathLike[str] | None = None
    sync: Callable[[], None] | None = None
    timing: str | None = None
    token: str | None = None
    leaders_per_stage: int = 1
    device_mesh: Any = None
    settings: ClientSettings | None = None
    connect: bool = True

    def __post_init__(self) -> None:
        for name in ("timeout_s", "round_timeout_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ConfigurationError(f"{name}={value!r} must be a positive number of seconds")
        if not isinstance(self.steps_per_round, int) or self.steps_per_round < 1:
            raise ConfigurationError(f"steps_per_round={self.steps_per_round!r} must be at least 1")

    def client_settings(self) -> ClientSettings:
        """The settings, with the options given here winning over the environment's."""
        base = self.settings if self.settings is not None else ClientSettings.load()
        given = {
            "timing": self.timing,
            "token": self.token,
            "trace_dir": self.trace_dir,
            "emulation": self.emulation,
        }
        changes = {k: v for k, v in given.items() if v is not None}
        if not changes:
            return base
        fields = {name: getattr(base, name) for name in type(base).model_fields}
        return ClientSettings.load(**{**fields, **changes})

    def expected_for(self, pp_rank: int, pp_degree: int) -> list[str] | None:
        """This rank's expected instruction names (given, or its order in the pipeline)."""
        pipeline = self.pipeline
        if pipeline is not None and pipeline.num_ranks != pp_degree:
            raise ConfigurationError(
                f"The pipeline's orders are for {pipeline.num_ranks} pipeline rank(s) but "
                f"pp_degree is {pp_degree}"
            )
        if self.expected_instructions is not None:
            return list(self.expected_instructions)
        if pipeline is not None:
            return [kind for _, kind, _ in pipeline.orders[pp_rank]]
        return None
