"""Pluggable frequency schedulers, chosen by ``PERSEUS_SCHEDULER``.

`SCHEDULERS` is the explicit name → class registry that `PerseusSettings` resolves short
names against; a ``module:Class`` name loads a plugin instead.
"""

from schedulers.base import FrequencyScheduler

SCHEDULERS: dict[str, type[FrequencyScheduler]] = {}

__all__ = ["SCHEDULERS", "FrequencyScheduler"]
