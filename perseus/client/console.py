"""What a training job says without any setup: rank 0's ``perseus`` log on stderr.

Python logs nothing below WARNING until the application configures `logging`, so a job that
never did would run its whole profiling and deployment in silence. `setup_job_logging`
gives the ``perseus`` logger a stderr handler on rank 0, at INFO by default
(``PERSEUS_LOG_LEVEL``: DEBUG, INFO, WARNING, ERROR), and stays out of the way of an
application that configures logging itself: the handler drops a record whenever the root
logger has handlers of its own (they print it), so nothing is printed twice, whenever the
application set logging up. Other ranks are left as the application set them (Python's
default prints warnings and errors only), so a 1,000-rank job tells one story, not a
thousand.
"""

from __future__ import annotations

import logging
import sys

from perseus.errors import ConfigurationError

__all__ = ["LOG_LEVELS", "setup_job_logging"]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
_FORMAT = "[perseus %(asctime)s] %(message)s"


class _UnlessRootHandles(logging.Filter):
    """Lets a record through only while the root logger has no handler to print it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not logging.getLogger().handlers


class _JobHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler `setup_job_logging` installs (found again by its type, never twice)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
        self.addFilter(_UnlessRootHandles())


def _level(value: str | None) -> int:
    name = (value or "INFO").strip().upper()
    if name not in LOG_LEVELS:
        raise ConfigurationError(
            f"PERSEUS_LOG_LEVEL={value!r} is not one of {', '.join(LOG_LEVELS)}"
        )
    return int(getattr(logging, name))


def setup_job_logging(rank: int, *, level: str | None = None) -> None:
    """Make rank 0's ``perseus`` log visible on stderr (see the module docstring).

    `level`: ``ClientSettings.log_level`` (``PERSEUS_LOG_LEVEL``; INFO when None); a bad
    value is a `ConfigurationError` naming it (checked on every rank). Other ranks are left
    alone.
    """
    wanted = _level(level)
    if rank != 0:
        return
    logger = logging.getLogger("perseus")
    logger.setLevel(wanted)
    if not any(isinstance(h, _JobHandler) for h in logger.handlers):
        logger.addHandler(_JobHandler())
