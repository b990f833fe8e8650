"""Local text: a file, a directory or a glob, read as UTF-8 bytes through ``datasets``."""

from __future__ import annotations

import glob
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import MISSING

from posbench.data.corpus import Splits, document_starts, documents_between
from posbench.errors import PosbenchError

log = logging.getLogger(__name__)


@dataclass
class TextDataConfig:
    name: str = "text"
    source: str = "text"
    path: str = MISSING
    val_path: str | None = None
    val_fraction: float = 0.1
    cache_dir: str | None = None


def _text_splits(config: TextDataConfig) -> Splits:
    """Train from ``path``; val from ``val_path``, else the last ``val_fraction`` of the bytes.

    Files are documents when a pattern names a directory or a glob (a single file is one
    stream); the ``val_fraction`` cut falls inside a document, whose two parts are documents.
    """
    if config.val_path is not None:
        train, train_documents = _read_text(config.path, "path")
        val, val_documents = _read_text(config.val_path, "val_path")
        return Splits(train, val, {}, train_documents, val_documents)
    if not 0 < config.val_fraction < 1:
        raise PosbenchError(f"data.val_fraction must be in (0, 1) (got {config.val_fraction})")
    data, documents = _read_text(config.path, "path")
    split = len(data) - round(len(data) * config.val_fraction)
    if documents is None:
        return Splits(data[:split], data[split:], {})
    train_documents = documents_between(documents, 0, split)
    val_documents = documents_between(documents, split, len(data))
    return Splits(data[:split], data[split:], {}, train_documents, val_documents)


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


def _read_text(pattern: str, key: str) -> tuple[np.ndarray, np.ndarray | None]:
    """The files of ``data.<key>`` concatenated like ``cat``, as UTF-8 bytes (raw bytes when
    they are not UTF-8 text), and where each file starts in them when ``pattern`` names a
    directory or a glob (None for a single file: one stream).

    datasets' text builder keeps every line break but reads in universal-newline mode, so
    ``\\r\\n`` and ``\\r`` arrive as ``\\n``. Streaming reads the files directly, without
    writing an Arrow copy next to the cache entry this corpus gets anyway.
    """
    import datasets  # a second to import, and only text and hub corpora need it

    files = [str(f) for f in _text_files(pattern, key)]
    one_stream = Path(pattern).expanduser().is_file()
    rows = datasets.load_dataset(
        "text", data_files=files, split="train", keep_linebreaks=True, streaming=True
    )
    try:
        data, _ = _encode(_column(rows, "text"))  # its texts are lines, not documents
        sizes = None if one_stream else [_universal_newline_size(f) for f in files]
    except UnicodeDecodeError:
        # The model reads bytes, so any file is a corpus: one that is not UTF-8 text (a binary
        # file, Latin-1 text) is taken byte for byte, with no newline translation.
        log.warning("data.%s '%s' is not UTF-8 text: training on its raw bytes", key, pattern)
        parts = [np.fromfile(f, dtype=np.uint8) for f in files]
        data, sizes = np.concatenate(parts), [len(part) for part in parts]
    if not len(data):
        raise PosbenchError(
            f"data.{key} '{pattern}' contains no text; point it at a non-empty text file"
        )
    if one_stream:
        return data, None
    assert sum(sizes) == len(data), "each file's bytes are where the concatenation has them"
    return data, document_starts(sizes)


def _universal_newline_size(file: str) -> int:
    """The UTF-8 size of a text file once read in universal-newline mode, as datasets reads it:
    ``\\r\\n`` becomes one byte, a lone ``\\r`` stays one byte."""
    raw = Path(file).read_bytes()
    return len(raw) - raw.count(b"\r\n")


def _column(rows: Any, name: str) -> Iterator[str]:
    """The strings of column ``name`` of a (possibly streaming) ``datasets`` dataset."""
    for batch in rows.iter(batch_size=1024):
        if name not in batch:
            raise PosbenchError(
                f"data.text_field '{name}' is not a column of the dataset "
                f"(columns: {', '.join(batch)})"
            )
        yield from batch[name]


def _encode(texts: Iterable[str], max_bytes: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``texts`` joined as UTF-8 bytes (uint8), cut at ``max_bytes``, reading no further, and
    where each non-empty text starts in them (``document_starts``; the cut keeps a head)."""
    chunks, size = [], 0
    for text in texts:
        chunks.append(text.encode("utf-8"))
        size += len(chunks[-1])
        if max_bytes is not None and size >= max_bytes:
            break
    data = np.frombuffer(bytearray().join(chunks), dtype=np.uint8)[:max_bytes]
    starts = document_starts([len(chunk) for chunk in chunks])
    return data, starts[starts < len(data)]
