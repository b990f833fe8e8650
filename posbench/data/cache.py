"""The corpus cache: one directory per config, checked against its checksums when read."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from posbench.atomic import atomic_write, write_json
from posbench.data.corpus import Corpus
from posbench.data.text import TextDataConfig, _text_files
from posbench.errors import PosbenchError

if TYPE_CHECKING:
    from posbench.data import DataConfig

log = logging.getLogger(__name__)

# Bump when the bytes a config produces change (a new generator, a new joining rule).
# 2: entries hold each split's document starts.
_CACHE_FORMAT = 2


def _cache_root(config: DataConfig) -> Path:
    """``data.cache_dir``, else ``$POSBENCH_CACHE``, else ``$XDG_CACHE_HOME/posbench``."""
    if config.cache_dir:
        return Path(config.cache_dir).expanduser()
    if os.environ.get("POSBENCH_CACHE"):
        return Path(os.environ["POSBENCH_CACHE"]).expanduser()
    return _xdg_cache_home() / "posbench"


def _xdg_cache_home() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


def _cache_key(config: DataConfig) -> str:
    """A hash of everything that determines the bytes: the config (its name and cache_dir
    aside), the cache format and, for local text, each file's path, size and mtime."""
    inputs = {k: v for k, v in asdict(config).items() if k not in ("name", "cache_dir")}
    if isinstance(config, TextDataConfig):
        patterns = {"path": config.path, "val_path": config.val_path}
        inputs["files"] = {
            key: [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in _text_files(p, key)]
            for key, p in patterns.items()
            if p is not None
        }
    material = json.dumps({"format": _CACHE_FORMAT, **inputs}, sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def _read_cache(entry: Path, name: str) -> Corpus | None:
    """The corpus stored at ``entry``, or None when it is missing or does not check out.

    ``meta.json`` is written last and records each split's length and SHA-256 and how many
    documents it has (null: none, no ``<split>_documents.npy``), so a partly written or damaged
    entry is rebuilt instead of trusted.
    """
    try:
        meta = json.loads((entry / "meta.json").read_text())
        splits = {}
        for split in ("train", "val"):
            data = np.load(entry / f"{split}.npy", allow_pickle=False)
            if data.dtype != np.uint8 or data.ndim != 1 or _digest(data) != meta[split]:
                raise ValueError(f"{split} split does not match its checksum")
            splits[split] = torch.from_numpy(data)
        documents = {
            f"{split}_documents": _read_documents(entry, split, meta, len(splits[split]))
            for split in ("train", "val")
        }
        return Corpus(name, splits["train"], splits["val"], meta["stats"], **documents)
    except FileNotFoundError:
        return None
    except (OSError, EOFError, ValueError, KeyError, TypeError) as error:
        log.warning("rebuilding damaged cache entry %s (%s)", entry, error)
        return None


def _write_cache(entry: Path, corpus: Corpus) -> None:
    """Store ``corpus`` at ``entry``, its ``meta.json`` last (see ``_read_cache``)."""
    splits = {"train": corpus.train.numpy(), "val": corpus.val.numpy()}
    documents = {"train": corpus.train_documents, "val": corpus.val_documents}
    try:
        for split, data in splits.items():
            atomic_write(entry / f"{split}.npy", _npy_bytes(data))
        for split, starts in documents.items():
            if starts is not None:
                atomic_write(entry / f"{split}_documents.npy", _npy_bytes(starts.numpy()))
        digests = {split: _digest(data) for split, data in splits.items()}
        counts = {split: None if d is None else len(d) for split, d in documents.items()}
        write_json(entry / "meta.json", {"stats": corpus.stats, **digests, "documents": counts})
    except OSError as error:
        raise PosbenchError(
            f"cannot write the data cache {entry} ({error.strerror}); "
            "set data.cache_dir or POSBENCH_CACHE to a writable directory"
        ) from error


def _read_documents(entry: Path, split: str, meta: dict, n_bytes: int) -> torch.Tensor | None:
    """The document starts of ``split`` (None when it has none), checked against the count
    ``meta.json`` records and the split's length: increasing offsets into it, from 0."""
    count = meta["documents"][split]
    if count is None:
        return None
    starts = np.load(entry / f"{split}_documents.npy", allow_pickle=False)
    if starts.dtype != np.int64 or starts.shape != (count,) or not count:
        raise ValueError(f"{split} documents do not match meta.json")
    if starts[0] != 0 or starts[-1] >= n_bytes or np.any(np.diff(starts) <= 0):
        raise ValueError(f"{split} documents are not increasing offsets into the split")
    return torch.from_numpy(starts)


def _npy_bytes(data: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, data)
    return buffer.getvalue()


def _digest(data: np.ndarray) -> dict[str, Any]:
    return {"bytes": len(data), "sha256": hashlib.sha256(data.data).hexdigest()}
