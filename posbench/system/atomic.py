"""Atomic file writes: a reader (or a crash) sees the old content or all of the new one."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

TEMP_SUFFIX = ".tmp"


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temp path beside ``path`` for the caller to write; on leaving the block it is fsynced
    and renamed over ``path``, so ``path`` holds either its old content or all of the new one.
    If the block raises, the temp file is removed and ``path`` is untouched."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fchmod(f.fileno(), 0o666 & ~_umask())  # mkstemp's 0600 would hide it from others
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see ``atomic_path``)."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def leftover_temp_files(directory: Path) -> list[Path]:
    """Temp files of ``atomic_path`` that a killed process left in ``directory``."""
    return sorted(p for p in Path(directory).glob(f".*{TEMP_SUFFIX}") if p.is_file())


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


@contextmanager
def replace_directory(path: Path) -> Iterator[Path]:
    """A temp directory beside ``path`` for the caller to fill; on leaving the block it takes
    ``path``'s place, so a reader sees the old directory, for an instant none, or the whole new
    one, never a half-written one. If the block raises, ``path`` is untouched."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if path.exists():
        old = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".old"))
        os.replace(path, old / path.name)
    os.replace(tmp, path)
    if old is not None:
        shutil.rmtree(old)
    _fsync_directory(path.parent)
