"""Local text: a file, a directory or a glob, read as UTF-8 bytes through ``datasets``."""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from posbench.data.corpus import CHUNK_BYTES, SplitWriter
from posbench.errors import PosbenchError

log = logging.getLogger(__name__)


@dataclass
class TextDataConfig:
    name: str = "text"
    source: str = "text"
    path: str = MISSING
    val_path: str | None = None
    val_fraction: float = 0.1
    max_bytes: int | None = None  # read at most this much of path, and of val_path
    cache_dir: str | None = None


def _write_text(config: TextDataConfig, train: SplitWriter, val: SplitWriter) -> dict[str, float]:
    """Train from ``path``; val from ``val_path``, else the last ``val_fraction`` of the bytes
    (read from ``path`` up to ``max_bytes``).

    Files are documents when a pattern names a directory or a glob (a single file is one
    stream); the ``val_fraction`` cut falls inside a document, whose two parts are documents.
    """
    if config.val_path is not None:
        _read_text(config.path, "path", config.max_bytes, train)
        _read_text(config.val_path, "val_path", config.max_bytes, val)
        return {}
    if not 0 < config.val_fraction < 1:
        raise PosbenchError(f"data.val_fraction must be in (0, 1) (got {config.val_fraction})")
    _read_text(config.path, "path", config.max_bytes, train)
    train.move_tail(round(len(train) * config.val_fraction), into=val)
    return {}


def _check_held_out(config: TextDataConfig) -> None:
    """Refuse a ``data.val_path`` file that is also a training file (the same file, or one
    inside a ``data.path`` directory or glob): its perplexity would measure memorisation."""
    shared = sorted(
        set(_text_files(config.path, "path")) & set(_text_files(config.val_path, "val_path"))
    )
    if shared:
        raise PosbenchError(
            f"data.val_path '{config.val_path}' is also in the training set data.path "
            f"'{config.path}' ({shared[0]}); point data.val_path at a file outside data.path, "
            "or leave it null to hold out the last data.val_fraction"
        )


def _text_files(pattern: str, key: str) -> list[Path]:
    """The files ``data.<key>`` names: a file, every non-hidden file under a directory, or the
    files a glob (``**`` included) matches; sorted, resolved."""
    path = Path(pattern).expanduser()
    if path.is_file():
        candidates = [path]
    elif path.is_dir():
        candidates = [p for p in path.rglob("*") if not _hidden(p.relative_to(path))]
    else:
        candidates = [Path(p) for p in glob.glob(str(path), recursive=True)]
    files = sorted(p.resolve() for p in candidates if p.is_file())
    if not files:
        raise PosbenchError(
            f"data.{key} '{pattern}' matches no file; point data.{key} at a text file, "
            "a directory or a glob"
        )
    return files


def _hidden(relative: Path) -> bool:
    # Version-control and editor droppings (.git/, .DS_Store) are not part of a corpus.
    return any(part.startswith(".") for part in relative.parts)


def _read_text(pattern: str, key: str, max_bytes: int | None, out: SplitWriter) -> None:
    """Write the files of ``data.<key>``, concatenated like ``cat``, to the empty ``out`` as
    UTF-8 bytes (raw bytes when they are not UTF-8 text), stopping at ``max_bytes``; each file
    is a document of ``out`` when ``pattern`` names a directory or a glob (a single file is one
    stream).

    datasets' text builder keeps every line break but reads in universal-newline mode, so
    ``\\r\\n`` and ``\\r`` arrive as ``\\n``. Streaming reads the files directly, without
    writing an Arrow copy next to the cache entry this corpus gets anyway.
    """
    import datasets  # a second to import, and only text and hub corpora need it

    files = [str(f) for f in _text_files(pattern, key)]
    one_stream = Path(pattern).expanduser().is_file()
    rows = datasets.load_dataset(
        "text",
        data_files=files,
        split="train",
        keep_linebreaks=True,
        streaming=True,
        chunksize=CHUNK_BYTES,  # the bytes it reads at a time (10 MB by default)
    )
    size_of = _universal_newline_size
    try:
        for chunk in _encode(_column(rows, "text"), max_bytes):  # texts: lines, not documents
            out.write(chunk)
    except UnicodeDecodeError:
        # The model reads bytes, so any file is a corpus: one that is not UTF-8 text (a binary
        # file, Latin-1 text) is taken byte for byte, with no newline translation.
        log.warning("data.%s '%s' is not UTF-8 text: training on its raw bytes", key, pattern)
        out.clear()
        for chunk in _capped(_file_chunks(files), max_bytes):
            out.write(chunk)
        size_of = os.path.getsize
    if not len(out):
        raise PosbenchError(
            f"data.{key} '{pattern}' contains no text; point it at a non-empty text file"
        )
    if not one_stream:
        out.set_documents(_leading_sizes(files, size_of, len(out)))


def _leading_sizes(files: Iterable[str], size_of: Callable[[str], int], total: int) -> list[int]:
    """The sizes of the first ``files``, as far as the one that reaches ``total`` bytes: a byte
    cap stops reading inside it, so the files after it are neither read nor sized."""
    sizes, size = [], 0
    for file in files:
        if size >= total:
            break
        sizes.append(size_of(file))
        size += sizes[-1]
    return sizes


def _universal_newline_size(file: str) -> int:
    """The UTF-8 size of a text file once read in universal-newline mode, as datasets reads it:
    ``\\r\\n`` becomes one byte, a lone ``\\r`` stays one byte. Read a chunk at a time."""
    size, after_cr = 0, False
    for chunk in _file_chunks([file]):
        crlf = chunk.count(b"\r\n") + (after_cr and chunk.startswith(b"\n"))
        size += len(chunk) - crlf
        after_cr = chunk.endswith(b"\r")
    return size


def _file_chunks(files: Iterable[str]) -> Iterator[bytes]:
    for path in files:
        with open(path, "rb") as file:
            while chunk := file.read(CHUNK_BYTES):
                yield chunk


def _column(rows: Any, name: str) -> Iterator[str]:
    """The strings of column ``name`` of a (possibly streaming) ``datasets`` dataset."""
    for batch in rows.iter(batch_size=1024):
        if name not in batch:
            raise PosbenchError(
                f"data.text_field '{name}' is not a column of the dataset "
                f"(columns: {', '.join(batch)})"
            )
        yield from batch[name]


def _encode(
    texts: Iterable[str], max_bytes: int | None = None, sizes: list[int] | None = None
) -> Iterator[bytes]:
    """``texts`` joined as UTF-8 bytes, in chunks of about CHUNK_BYTES, cut at ``max_bytes``:
    no more than a chunk is held at once, and nothing is read past the chunk that fills
    ``max_bytes``. ``sizes``, when given, gets the size of each text read (texts that are
    documents: ``SplitWriter.set_documents``)."""
    pieces = (text.encode("utf-8") for text in texts)
    if sizes is not None:
        pieces = _sized(pieces, sizes)
    return _capped(_joined(pieces), max_bytes)


def _sized(pieces: Iterable[bytes], sizes: list[int]) -> Iterator[bytes]:
    for piece in pieces:
        sizes.append(len(piece))
        yield piece


def _joined(pieces: Iterable[bytes]) -> Iterator[bytes]:
    """``pieces`` joined into chunks of at least CHUNK_BYTES (the last may be shorter): few
    enough for each write to be cheap, small enough to hold."""
    pending, size = [], 0
    for piece in pieces:
        pending.append(piece)
        size += len(piece)
        if size >= CHUNK_BYTES:
            yield b"".join(pending)
            pending, size = [], 0
    if pending:
        yield b"".join(pending)


def _capped(chunks: Iterable[bytes], max_bytes: int | None) -> Iterator[bytes]:
    """``chunks`` up to ``max_bytes`` bytes in all (the last one cut), reading no further."""
    left = max_bytes
    for chunk in chunks:
        if left is not None:
            chunk = chunk[:left]
            left -= len(chunk)
        yield chunk
        if left == 0:
            return
