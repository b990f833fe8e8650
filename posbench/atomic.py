"""Atomic file writes: a reader (or a crash) sees the old content or all of the new one."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` so that ``path`` holds either its old content or all of the new one:
    a temp file in the same directory, flushed and fsynced, then renamed over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 would hide results from others
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def _umask() -> int:
    mask = os.umask(0)  # the only way to read it is to set it
    os.umask(mask)
    return mask


def _fsync_directory(directory: Path) -> None:
    """Persist the rename itself: without this a power cut can lose the new directory entry."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: Path, obj: Any) -> None:
    atomic_write(path, (json.dumps(obj, indent=2) + "\n").encode())
