"""Refuse work that cannot fit in memory before starting it.

An out-of-memory kill ends a command with "Killed" and no word on why, often minutes in.
The builders of big structures (schedules, profiles, frontiers) instead compare what
they are about to allocate with what the machine (or its cgroup) can still give, and
raise a clear error naming the size asked for.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["available_memory_bytes", "memory_shortfall"]

_GIB = 1024**3


def _cgroup_room() -> int | None:
    """Bytes left under this process's cgroup v2 memory limit, if it has one."""
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit == "max":
            return None
        used = Path("/sys/fs/cgroup/memory.current").read_text().strip()
        return max(int(limit) - int(used), 0)
    except (OSError, ValueError):
        return None


def available_memory_bytes() -> int | None:
    """Memory this process can still allocate, in bytes; ``None`` where it cannot be told.

    Linux's ``MemAvailable`` (page cache counts as free), capped by a cgroup v2 limit;
    elsewhere the free physical pages.
    """
    room: int | None = None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    room = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        room = None
    if room is None:
        try:
            room = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            room = None
    cgroup = _cgroup_room()
    if cgroup is not None:
        room = cgroup if room is None else min(room, cgroup)
    return room


def memory_shortfall(need_bytes: float, what: str) -> str | None:
    """A message when `need_bytes` exceed the available memory, else ``None``.

    `what` names the structure, e.g. ``"the 1f1b schedule of 8 stages × 10⁹ microbatches"``.
    """
    room = available_memory_bytes()
    if room is None or need_bytes <= room:
        return None
    return (
        f"{what} needs about {need_bytes / _GIB:,.1f} GiB of memory, but only "
        f"{room / _GIB:,.1f} GiB is available"
    )
