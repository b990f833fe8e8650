"""Hub corpora: a ``datasets`` corpus (a hub id or a local dataset directory) as bytes."""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from posbench.data.cache import CHUNK_BYTES
from posbench.data.corpus import SplitWriter
from posbench.data.tokenizer import TokenizerOptions
from posbench.errors import PosbenchError
from posbench.system.cache_root import xdg_cache_home


@dataclass
class HubDataConfig(TokenizerOptions):
    name: str = MISSING
    source: str = "hub"
    hub_path: str = MISSING
    hub_name: str | None = None
    text_field: str = "text"
    rows_are_documents: bool = False  # pg19: a row is a book; wikitext: a row is a line
    train_split: str = "train"
    val_split: str = "validation"
    max_bytes: int | None = None  # per split: stream only this much of each
    cache_dir: str | None = None


def _write_hub(config: HubDataConfig, train: SplitWriter, val: SplitWriter) -> dict[str, float]:
    _read_hub(config, config.train_split, train)
    _read_hub(config, config.val_split, val)
    return {}


def _read_hub(config: HubDataConfig, split: str, out: SplitWriter) -> None:
    """Write one split of a ``datasets`` corpus (a hub id or a local dataset directory) to
    ``out`` as bytes, up to ``data.max_bytes``, each row a document of ``out`` with
    ``data.rows_are_documents``.

    Each row becomes a line: rows that end in a newline (wikitext's) are kept as they are, rows
    that do not (pg19's books) get one. With a byte cap the split is streamed, so only about
    that much is downloaded; the row the cap cuts keeps its head.
    """
    import datasets  # a second to import, and only hub corpora need it

    try:
        rows = datasets.load_dataset(
            config.hub_path, config.hub_name, split=split, streaming=config.max_bytes is not None
        )
        lines = (
            text if text.endswith("\n") else text + "\n"
            for text in _column(rows, config.text_field)
        )
        sizes: list[int] | None = [] if config.rows_are_documents else None
        for chunk in _encode(lines, config.max_bytes, sizes):
            out.write(chunk)
        if sizes is not None:
            out.set_documents(sizes)
    except ConnectionError as error:
        raise _hub_unreachable(config.hub_path) from error
    except (FileNotFoundError, ValueError) as error:
        raise PosbenchError(
            f"cannot load split '{split}' of data.hub_path '{config.hub_path}' "
            f"(data.hub_name={config.hub_name}): {str(error).splitlines()[0]}"
        ) from error


def _check_hub_available(hub_path: str) -> None:
    """Fail in a second when a hub corpus can be neither downloaded nor found in the cache:
    checked before ``datasets`` is imported (seconds by itself) and before anything is built,
    from the environment variables datasets and huggingface_hub read themselves. A local
    dataset directory needs neither."""
    if os.path.isdir(hub_path):
        return
    if _hub_offline():
        if not _hub_cached(hub_path):
            raise _hub_unreachable(hub_path)
    elif not _reachable(os.environ.get("HF_ENDPOINT", "https://huggingface.co")):
        raise _hub_unreachable(hub_path)


def _hub_offline() -> bool:
    flags = (os.environ.get(name, "").upper() for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"))
    return any(flag in {"1", "ON", "YES", "TRUE"} for flag in flags)


def _hub_cached(hub_path: str) -> bool:
    """Whether datasets' cache (``<namespace>___<name>``) or the hub's file cache
    (``datasets--<namespace>--<name>``) holds anything of ``hub_path``, which is all that
    offline mode can load."""
    hf_home = Path(os.environ.get("HF_HOME", xdg_cache_home() / "huggingface"))
    datasets_cache = Path(os.environ.get("HF_DATASETS_CACHE", hf_home / "datasets"))
    hub_cache = Path(os.environ.get("HF_HUB_CACHE", hf_home / "hub"))
    return (
        any(datasets_cache.glob(f"{hub_path.replace('/', '___')}*"))
        or (hub_cache / f"datasets--{hub_path.replace('/', '--')}").is_dir()
    )


def _reachable(url: str, timeout: float = 5.0) -> bool:
    """Whether anything answers at ``url`` (any HTTP status counts). Checked first because
    without a network datasets retries with backoff for half a minute before giving up."""
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout).close()
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, TimeoutError):
        return False
    return True


def _hub_unreachable(hub_path: str) -> PosbenchError:
    return PosbenchError(
        f"cannot download '{hub_path}': the Hugging Face Hub is unreachable or offline mode is "
        "on, and datasets has no cached copy to use (it looks for one when HF_DATASETS_OFFLINE=1); "
        "train on local text instead: data=text data.path=<file, directory or glob>"
    )


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
