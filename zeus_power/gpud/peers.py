"""Who is at the other end of a Unix-socket connection, and whether that process still runs.

Each connection on the Unix socket carries its peer's credentials (``SO_PEERCRED``: pid,
uid, gid, filled in by the kernel, unforgeable). A process is identified by its pid *and*
its start time (field 22 of ``/proc/<pid>/stat``), so a recycled pid does not count as the
same process, and a zombie counts as gone. Over TCP there is no peer.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

__all__ = ["Peer", "alive", "peer_of", "start_ticks"]


@dataclass(frozen=True)
class Peer:
    """The process at the other end of a Unix-socket connection."""

    pid: int
    uid: int
    start_ticks: str
    """Field 22 of /proc/<pid>/stat: tells a pid's reuse from the original process."""


def start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks; None when it is gone (or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return fields[19]


def peer_of(sock: socket.socket) -> Peer | None:
    """The peer of a Unix-socket connection (Linux ``SO_PEERCRED``); None elsewhere."""
    option = getattr(socket, "SO_PEERCRED", None)
    if sock.family != socket.AF_UNIX or option is None:
        return None
    pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, option, 12))
    ticks = start_ticks(pid) if pid > 0 else None
    return None if ticks is None else Peer(pid, uid, ticks)


def alive(peer: Peer) -> bool:
    """Whether the very process `peer` names still runs (not a zombie, not a reused pid)."""
    return start_ticks(peer.pid) == peer.start_ticks
