"""Local text: a file, a directory or a glob, read a chunk of bytes at a time."""

from __future__ import annotations

import codecs
import glob
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from omegaconf import MISSING

from posbench.data.cache import CHUNK_BYTES
from posbench.data.corpus import SplitWriter
from posbench.data.tokenizer import TokenizerOptions
from posbench.errors import PosbenchError

log = logging.getLogger(__name__)


@dataclass
class TextDataConfig(TokenizerOptions):
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


def _text_file_stamps(config: TextDataConfig) -> dict[str, list[list]]:
    """The path, size and mtime of each file ``data.path`` and ``data.val_path`` name, by key:
    part of the cache key, so that a file that changes is read again."""
    patterns = {"path": config.path, "val_path": config.val_path}
    return {
        key: [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in _text_files(p, key)]
        for key, p in patterns.items()
        if p is not None
    }


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
    """Write the files of ``data.<key>``, concatenated like ``cat``, to the empty ``out``,
    stopping at ``max_bytes``; each file is a document of ``out`` when ``pattern`` names a
    directory or a glob (a single file is one stream).

    UTF-8 text is read in universal-newline mode, as Python's ``open`` reads text: ``\\r\\n``
    and a lone ``\\r`` become ``\\n``, and nothing else changes (no newline is added, a BOM
    stays). Files that are not UTF-8 text as far as they are read (``max_bytes`` stops the
    reading) are taken byte for byte. Either way they are read a chunk at a time, whatever
    their lines, so building holds a chunk, never a line or a file (text8 is 100 MB without a
    line break).
    """
    files = _text_files(pattern, key)
    try:
        sizes = _copy_files(files, max_bytes, out, CHUNK_BYTES, as_text=True)
    except UnicodeDecodeError:
        # The model reads bytes, so any file is a corpus: one that is not UTF-8 text (a binary
        # file, Latin-1 text) is taken byte for byte, with no newline translation.
        log.warning("data.%s '%s' is not UTF-8 text: training on its raw bytes", key, pattern)
        out.clear()
        sizes = _copy_files(files, max_bytes, out, CHUNK_BYTES, as_text=False)
    if not len(out):
        raise PosbenchError(
            f"data.{key} '{pattern}' contains no text; point it at a non-empty text file"
        )
    if not Path(pattern).expanduser().is_file():
        out.set_documents(sizes)


def _copy_files(
    files: Iterable[Path], max_bytes: int | None, out: SplitWriter, chunk_bytes: int, as_text: bool
) -> list[int]:
    """Append ``files`` to ``out``, read ``chunk_bytes`` at a time, up to ``max_bytes`` in all;
    the bytes written of each file, as far as the one the cap cuts (the files after it are not
    opened).

    ``as_text``: each file is UTF-8 text, read in universal-newline mode (``_universal_newlines``)
    and checked as it is written, so UnicodeDecodeError means a file is not text: one whose
    bytes up to the cap are not UTF-8, or which ends inside a character. Otherwise the bytes
    are copied as they are."""
    sizes, left = [], max_bytes
    for file in files:
        chunks = _file_chunks(file, chunk_bytes)
        if as_text:
            chunks = _universal_newlines(chunks)
        utf8 = codecs.getincrementaldecoder("utf-8")()  # holds a character cut by a chunk's end
        sizes.append(0)
        for chunk in chunks:
            if left is not None:
                chunk = chunk[:left]
                left -= len(chunk)
            if as_text:
                utf8.decode(chunk)  # raises UnicodeDecodeError at the first byte that is not UTF-8
            out.write(chunk)
            sizes[-1] += len(chunk)
            if left == 0:
                return sizes  # a character the cap cuts in two is text: its head is kept
        if as_text:
            utf8.decode(b"", final=True)
    return sizes


def _universal_newlines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The bytes of ``chunks`` with each ``\\r\\n`` and each lone ``\\r`` as ``\\n``, chunk by
    chunk: a ``\\r\\n`` split between two chunks is one ``\\n`` too."""
    after_cr = False
    for chunk in chunks:
        if after_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]  # the \n of a \r\n whose \r ended the last chunk (now a \n)
        after_cr = chunk.endswith(b"\r")
        if b"\r" in chunk:  # most text has none: one scan rather than two replaces
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        yield chunk


def _file_chunks(path: Path, chunk_bytes: int) -> Iterator[bytes]:
    with open(path, "rb") as file:
        while chunk := file.read(chunk_bytes):
            yield chunk
