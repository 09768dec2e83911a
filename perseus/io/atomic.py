"""The atomic writers: readers never see half a file (`atomic_write_text`) or half a
directory (`replace_dir`)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

__all__ = ["atomic_write_text", "replace_dir", "sibling_tmp_dir"]


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` to `path` via a temporary file and rename, so readers never see half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def sibling_tmp_dir(path: str | os.PathLike[str]) -> Path:
    """A new name beside `path` to write a whole directory under before `replace_dir` puts
    it at `path` (``NAME.tmp-<hex>``: the same file system, so the rename is atomic)."""
    path = Path(path)
    return path.with_name(f"{path.name}.tmp-{uuid.uuid4().hex[:12]}")


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False where the
    system or the file system cannot."""
    if sys.platform != "linux":
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    done = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
    return bool(done == 0)


def replace_dir(new: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """Put the complete directory `new` (on `path`'s file system: `sibling_tmp_dir`) at
    `path`, replacing the directory there, by renames only: readers see the old directory
    or the new one, never a mix or half of one, and the old contents are never deleted
    before the new ones are in place.

    With no old directory it is one rename. Else, on Linux, the two are swapped in one
    system call (``renameat2`` with ``RENAME_EXCHANGE``) and the old one, now at `new`, is
    removed; where that is not available, the old one is renamed aside
    (``NAME.old-<hex>``) and the new one renamed in: `path` is then absent for the
    instant between the two renames (a crash there leaves the old one complete aside).
    """
    new, path = Path(new), Path(path)
    if not path.exists():
        os.replace(new, path)
        return
    if _exchange(new, path):
        shutil.rmtree(new, ignore_errors=True)
        return
    aside = path.with_name(f"{path.name}.old-{uuid.uuid4().hex[:12]}")
    os.replace(path, aside)
    try:
        os.replace(new, path)
    except BaseException:
        os.replace(aside, path)  # put the old one back
        raise
    shutil.rmtree(aside, ignore_errors=True)
