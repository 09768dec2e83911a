"""`HFGlobalPowerLimitOptimizer`: `GlobalPowerLimitOptimizer` as a Hugging Face
`TrainerCallback`, built on first access (`zeus_power.power_limit.HFGlobalPowerLimitOptimizer`)
so that nothing else needs `transformers`."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from zeus_power.monitor import ZeusMonitor
from zeus_power.power_limit.selectors import OptimumSelector

__all__ = ["build_hf_class"]


@functools.cache
def build_hf_class(optimizer_cls: type) -> type:
    """The callback class wrapping `optimizer_cls` (`GlobalPowerLimitOptimizer`)."""
    try:
        from transformers import TrainerCallback
    except ImportError as exc:
        raise ImportError(
            "HFGlobalPowerLimitOptimizer needs Hugging Face transformers: "
            "pip install 'perseus-energy[hf]'."
        ) from exc

    class HFGlobalPowerLimitOptimizer(TrainerCallback):  # type: ignore[misc,valid-type]
        """[Hugging Face `TrainerCallback`] Optimizer for the power limit knob.

        Takes the arguments of `GlobalPowerLimitOptimizer`, which does the work.
        """

        def __init__(
            self,
            monitor: ZeusMonitor,
            optimum_selector: OptimumSelector | None = None,
            wait_steps: int = 1,
            warmup_steps: int = 10,
            profile_steps: int = 40,
            pl_step: int = 25,
            profile_path: str | Path | None = None,
        ) -> None:
            self.optimizer = optimizer_cls(
                monitor,
                optimum_selector=optimum_selector,
                wait_steps=wait_steps,
                warmup_steps=warmup_steps,
                profile_steps=profile_steps,
                pl_step=pl_step,
                profile_path=profile_path,
            )

        def on_epoch_end(
            self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any
        ) -> None:
            """Mark the end of a training epoch."""
            self.optimizer.on_epoch_end()

        def on_step_begin(
            self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any
        ) -> None:
            """Mark the beginning of a training step."""
            self.optimizer.on_step_begin()

    return HFGlobalPowerLimitOptimizer
