"""Atomic file writes: write a temporary file in the same folder, fsync, then rename.

A crash at any moment leaves either the old file or the new one, never half of either; once
`atomic_write` returns, the rename itself is on disk (the folder is fsynced). A written file gets the
permissions `open()` would give it (0666 masked by the umask), whatever the writer did to the
temporary file (mkstemp makes 0600; safetensors renames its own 0600 temporary file over it).
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Call `write(tmp_path)` to produce the file, then rename it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # after the writer: it may have replaced the file
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def fsync_dir(folder: str | os.PathLike) -> None:
    """Put the folder's entries (renames, links, unlinks so far) on disk: the barrier between two steps of
    a multi-file update. A file system that cannot sync a folder (EINVAL) is left to its own order."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def _umask() -> int:
    """The process umask, read without changing it where Linux shows it (os.umask must set one to read
    it, and another thread creating a file in between would get the one set)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)

    atomic_write(path, write)


def atomic_write_json(path: str | os.PathLike, obj: object) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")
