"""The corpus cache: one directory per config, its arrays memory-mapped when read.

This module is the cache's format (what an entry holds, how it is built, read and checked) and
knows no source: it sits below the sources (text, hub, synthetic), which write into an entry
through ``EntryBuilder``, and posbench/data/__init__.py gives ``entry_path`` the inputs that key
a corpus's entry.

An entry ``<source>-<key>`` holds one flat file per named array, ``<name>.bin`` (raw values,
no header: ``train.bin`` and ``val.bin`` are a corpus's bytes; ``train_documents.bin`` and
``val_documents.bin``, when its source has documents, where they start), and ``meta.json``,
which records each array's dtype, shape and SHA-256 (under ``arrays``) and the corpus's
``stats``.

Reading maps the files read-only (``np.memmap``), so a corpus larger than memory costs only the
pages training and evaluation touch. The check on load compares each file's size with the
dtype and shape of ``meta.json`` but does not hash it: hashing would read the whole corpus on
every run. So a missing or truncated file and a damaged ``meta.json`` are caught and the entry
rebuilt, but a byte changed in place is not; the SHA-256, taken once while building, is there
for ``verify_entry``.

Building streams: ``EntryBuilder.array`` appends to a file chunk by chunk, hashing as it goes,
so a build holds a chunk, never a split. Files are written under temporary names and renamed
into place when the build succeeds, ``meta.json`` last (atomically): a killed first build
leaves no ``meta.json``, so the entry is built again. Files are replaced, never rewritten in
place: a process that has mapped the old ones keeps reading them (one whose mapped file was
truncated in place would die of SIGBUS on its next read past the end).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from posbench.errors import PosbenchError
from posbench.system.atomic import atomic_path, write_json
from posbench.system.cache_root import cache_root

log = logging.getLogger(__name__)

# Bump when the bytes a config produces or the entry's layout change (a new generator, a new
# joining rule, a new file format): the key changes with it, so old entries are not read.
# 2: flat memory-mapped arrays; 3: entries hold each split's document starts.
_CACHE_FORMAT = 3

META_FILE = "meta.json"

# Building streams bytes in chunks of about this size, so it holds about this much at once.
CHUNK_BYTES = 1 << 20


def entry_path(cache_dir: str | None, source: str, inputs: Mapping[str, Any]) -> Path:
    """The directory that holds (or will hold) the arrays ``source`` builds from ``inputs``,
    everything that determines their bytes (JSON values): ``<source>-<key>``, the key a hash
    of ``inputs`` and the cache format, under ``cache_root(cache_dir)``."""
    material = json.dumps({"format": _CACHE_FORMAT, **inputs}, sort_keys=True)
    key = hashlib.sha256(material.encode()).hexdigest()[:16]
    return cache_root(cache_dir) / f"{source}-{key}"


def _array_path(entry: Path, name: str) -> Path:
    return entry / f"{name}.bin"


# Reading -------------------------------------------------------------------------------------


def read_entry(
    entry: Path,
    names: Sequence[str],
    optional: Sequence[str] = (),
    check: Callable[[dict[str, np.ndarray]], None] | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
    """The arrays ``names`` of ``entry``, and those of ``optional`` it holds, memory-mapped
    read-only, and its ``meta.json``; None when the entry is missing or does not check out
    (then it is to be rebuilt): a file's size, or ``check``, which raises ValueError when the
    arrays do not fit together."""
    if not (entry / META_FILE).exists():
        return None  # never built (or its first build did not finish)
    try:
        meta = json.loads((entry / META_FILE).read_text())
        if meta["format"] != _CACHE_FORMAT:
            raise ValueError(f"format {meta['format']}, not {_CACHE_FORMAT}")
        held = [*names, *(name for name in optional if name in meta["arrays"])]
        arrays = {name: _map_array(entry, name, meta["arrays"][name]) for name in held}
        if check is not None:
            check(arrays)
        return arrays, meta
    except (OSError, ValueError, KeyError, TypeError) as error:
        log.warning("rebuilding damaged cache entry %s (%s)", entry, error)
        return None


def _map_array(entry: Path, name: str, record: dict[str, Any]) -> np.ndarray:
    """``<name>.bin`` as a read-only memory map, after checking its size against ``record``
    (its dtype and shape): cheap, unlike its SHA-256, which would read the whole file."""
    dtype, shape = np.dtype(record["dtype"]), tuple(int(n) for n in record["shape"])
    path = _array_path(entry, name)
    expected, size = dtype.itemsize * math.prod(shape), path.stat().st_size
    if size != expected:
        raise ValueError(f"{path.name} has {size} bytes, {META_FILE} says {expected}")
    if not expected:
        return np.empty(shape, dtype)  # an empty file cannot be mapped
    return np.memmap(path, dtype=dtype, mode="r", shape=shape)


def verify_entry(entry: Path) -> list[str]:
    """The names of ``entry``'s arrays whose SHA-256 no longer matches ``meta.json``: the full
    check that loading skips (it reads every byte of the entry)."""
    meta = json.loads((entry / META_FILE).read_text())
    return [
        name
        for name, record in meta["arrays"].items()
        if _file_sha256(_array_path(entry, name)) != record["sha256"]
    ]


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


# Building ------------------------------------------------------------------------------------


class ArrayWriter:
    """One flat array of an entry being built: values appended to its file, hashed as they
    come, so the SHA-256 costs no second pass."""

    def __init__(self, path: Path, dtype: np.dtype | type) -> None:
        self.path, self.dtype = path, np.dtype(dtype)
        self._file = open(path, "w+b")  # noqa: SIM115 (closed by close(), which the build calls)
        self._sha256 = hashlib.sha256()
        self._length = 0

    def __len__(self) -> int:
        return self._length

    def write(self, values: np.ndarray) -> None:
        """Append the 1-D ``values`` (converted to the array's dtype)."""
        values = np.ascontiguousarray(values, dtype=self.dtype)
        assert values.ndim == 1, "arrays are flat"
        with _writing(self.path.parent):  # a full disk shows here
            self._file.write(values.data)
        self._sha256.update(values.data)
        self._length += len(values)

    def read(self, start: int, stop: int) -> Iterator[np.ndarray]:
        """Values ``[start, stop)`` read back in chunks (file reads: nothing stays mapped)."""
        self._file.flush()
        size = self.dtype.itemsize
        step = max(1, CHUNK_BYTES // size)
        for offset in range(start, stop, step):
            data = os.pread(self._file.fileno(), min(step, stop - offset) * size, offset * size)
            yield np.frombuffer(data, dtype=self.dtype)

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` values; they are hashed again (a hash cannot be rewound)."""
        assert 0 <= length <= self._length
        self._file.flush()
        self._file.truncate(length * self.dtype.itemsize)
        self._file.seek(0, os.SEEK_END)
        self._sha256 = hashlib.sha256()
        for chunk in self.read(0, length):
            self._sha256.update(chunk.data)
        self._length = length

    def close(self) -> dict[str, Any]:
        """Close the file (again is fine); the array's record in ``meta.json``."""
        self._file.close()
        return {
            "dtype": self.dtype.str,
            "shape": [self._length],
            "sha256": self._sha256.hexdigest(),
        }


class EntryBuilder:
    """A cache entry being built (see ``build_entry``): ``array`` adds a named array, ``meta``
    collects what ``meta.json`` holds besides the arrays' records."""

    def __init__(self, entry: Path, files: ExitStack) -> None:
        self.entry = entry
        self.meta: dict[str, Any] = {}
        self._files = files  # each array's temporary file, renamed into place on leaving it
        self._arrays: dict[str, ArrayWriter] = {}

    def array(self, name: str, dtype: np.dtype | type = np.uint8) -> ArrayWriter:
        """A new array ``name`` (its file is ``<name>.bin``), to append to."""
        assert name not in self._arrays and name.isidentifier(), name
        with _writing(self.entry):
            temporary = self._files.enter_context(atomic_path(_array_path(self.entry, name)))
            writer = ArrayWriter(temporary, dtype)
        self._files.callback(writer.close)  # runs before atomic_path renames or removes it
        self._arrays[name] = writer
        return writer

    def write_array(self, name: str, values: np.ndarray) -> None:
        """A whole array at once: a small one, such as offsets into a split."""
        self.array(name, values.dtype).write(values)

    def records(self) -> dict[str, dict[str, Any]]:
        return {name: writer.close() for name, writer in self._arrays.items()}


@contextmanager
def build_entry(entry: Path) -> Iterator[EntryBuilder]:
    """Build ``entry``: when the block ends without an error its arrays take their place,
    ``meta.json`` last; if it raises, their temporary files are removed and the entry is left
    as it was. Builds of one key write the same bytes, so jobs that build it at once, and
    jobs that read it meanwhile, agree."""
    with _writing(entry):
        entry.mkdir(parents=True, exist_ok=True)
    with ExitStack() as files:
        builder = EntryBuilder(entry, files)
        yield builder  # an error from here (a source's) passes through untouched
        records = builder.records()
        renames = files.pop_all()
    with _writing(entry):
        renames.close()
        write_json(entry / META_FILE, {"format": _CACHE_FORMAT, **builder.meta, "arrays": records})


@contextmanager
def _writing(entry: Path) -> Iterator[None]:
    """A failure to write the cache (not writable, disk full) as a one-line error."""
    try:
        yield
    except OSError as error:
        raise PosbenchError(
            f"cannot write the data cache {entry} ({error.strerror}); "
            "set data.cache_dir or POSBENCH_CACHE to a writable directory"
        ) from error
