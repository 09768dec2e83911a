"""The one rule for leaving a Perseus context manager (`with PerseusOptimizer(...)`,
`with attach(...)`, `with CoordinatorClient(...)`), written once here:

- a **normal exit** closes and finishes (``close()``: the job is over and the coordinator
  is told so); an error while closing is raised, since there is nothing else to report;
- an **exceptional exit** closes without finishing (``close(finish=False)``: clocks are
  restored and threads stopped, the coordinator is told nothing and fails the job at its
  round timeout) and never masks the original error: an error while closing is logged as
  a warning, and the original error propagates.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import TracebackType
from typing import Protocol, TypeVar

__all__ = ["ClosesOnExit", "close_on_exit"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


def close_on_exit(what: str, exc: BaseException | None, close: Callable[[bool], None]) -> None:
    """Apply the rule (module docstring): `close(finish)` with ``finish = exc is None``."""
    if exc is None:
        close(True)
        return
    try:
        close(False)
    except Exception as close_exc:  # already failing: report it, never mask `exc`
        logger.warning(
            "%s: closing after %s also failed: %s: %s",
            what,
            type(exc).__name__,
            type(close_exc).__name__,
            close_exc,
        )


class _Closable(Protocol):
    def close(self, *, finish: bool = True) -> None: ...


class ClosesOnExit:
    """`__enter__` / `__exit__` by the rule, for a class with ``close(*, finish=True)``."""

    def __enter__(self: _T) -> _T:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        closable: _Closable = self  # type: ignore[assignment]
        close_on_exit(type(self).__name__, exc, lambda finish: closable.close(finish=finish))
