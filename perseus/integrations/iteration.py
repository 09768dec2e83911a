"""One training iteration as a framework runs it, checked against the order the job
registered: the part every adapter shares (`pipelining`, `deepspeed`, `megatron`).

An adapter wraps its framework's iteration in `OrderedIteration.run` and each computation
in `OrderedIteration.instruction`: the computation must be the next action of this rank's
order (else a `ScheduleError` naming both), it runs as a Perseus instruction, and an
iteration that ends with actions left over is a `ScheduleError` too. Outside `run` (an
evaluation pass, a step without backward, after the adapter closed) computations pass
through unmeasured.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TypeVar

from perseus.client.hook import PerseusOptimizer
from perseus.errors import ScheduleError
from perseus.integrations.orders import Action

__all__ = ["Action", "OrderedIteration"]

T = TypeVar("T")


class OrderedIteration:
    """This rank's walk through `order` during one iteration, for `hook`.

    Attributes:
        hook: This rank's `PerseusOptimizer`.
        order: This rank's compute actions of one iteration, in order.
        engine: What runs them, for messages (``Schedule1F1B``, ``DeepSpeed``, ...).
        order_name: What the order is called, for messages (``pipeline_order``, ...).
        describe: How an action reads in a message.
        next: The index of the next action.
        measuring: Whether an iteration is running (`run`).
    """

    def __init__(
        self,
        hook: PerseusOptimizer,
        order: list[Action],
        *,
        engine: str,
        order_name: str,
        describe: Callable[[Action], str] = str,
    ) -> None:
        self.hook = hook
        self.order = order
        self.engine = engine
        self.order_name = order_name
        self.describe = describe
        self.next = 0
        self.measuring = False

    @property
    def due(self) -> Action | None:
        """The next action (None: the iteration's actions have all run)."""
        return self.order[self.next] if self.next < len(self.order) else None

    def _where(self) -> str:
        return f"Rank {self.hook.rank} (pipeline rank {self.hook.pp_rank}), step {self.hook.step}"

    @contextlib.contextmanager
    def instruction(self, action: Action, *, ran: str | None = None) -> Iterator[None]:
        """Run `action` as a Perseus instruction; it must be the next action of the order
        (`ran`: how the message names what ran, where the adapter cannot tell it fully)."""
        if not self.measuring:
            yield
            return
        due = self.due
        if action != due:
            raise ScheduleError(
                f"{self._where()}: {self.engine} executed {ran or self.describe(action)} as "
                f"action #{self.next}, but its {self.order_name} says "
                f"{self.describe(due) if due is not None else 'nothing more'}"
            )
        stage, kind, microbatch = action
        self.hook.on_instruction_begin(kind, stage=stage, microbatch=microbatch)
        yield
        self.hook.on_instruction_end(kind)
        self.next += 1

    def run(self, iteration: Callable[[], T], *, missing_hint: str = "") -> T:
        """Run `iteration` (the framework's own call) as one Perseus iteration: every
        action of the order must run in it (`missing_hint`: appended to the message when
        some did not). On any error the hook's step is aborted and the error raised."""
        self.hook.on_step_begin()
        self.next, self.measuring = 0, True
        try:
            out = iteration()
            due = self.due
            if due is not None:
                raise ScheduleError(
                    f"{self._where()}: {self.engine} ran {self.next} of the {len(self.order)} "
                    f"compute actions of its {self.order_name}; the first one missing is "
                    f"{self.describe(due)}{missing_hint}"
                )
        except BaseException:
            self.measuring = False
            self.hook.abort_step()
            raise
        self.measuring = False
        self.hook.on_step_end()
        return out
