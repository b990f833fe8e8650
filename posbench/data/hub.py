"""Hub corpora: a ``datasets`` corpus (a hub id or a local dataset directory) as bytes."""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from dataclasses import dataclass

import numpy as np
from omegaconf import MISSING

from posbench.data.corpus import Splits
from posbench.data.text import _column, _encode
from posbench.errors import PosbenchError


@dataclass
class HubDataConfig:
    name: str = MISSING
    source: str = "hub"
    hub_path: str = MISSING
    hub_name: str | None = None
    text_field: str = "text"
    train_split: str = "train"
    val_split: str = "validation"
    max_train_bytes: int | None = None
    max_val_bytes: int | None = None
    cache_dir: str | None = None


def _hub_splits(config: HubDataConfig) -> Splits:
    caps = {"max_train_bytes": config.max_train_bytes, "max_val_bytes": config.max_val_bytes}
    for key, cap in caps.items():
        if cap is not None and cap <= 0:
            raise PosbenchError(f"data.{key} must be positive or null (got {cap})")
    train = _read_hub(config, config.train_split, config.max_train_bytes)
    val = _read_hub(config, config.val_split, config.max_val_bytes)
    return train, val, {}


def _read_hub(config: HubDataConfig, split: str, max_bytes: int | None) -> np.ndarray:
    """One split of a ``datasets`` corpus (a hub id or a local dataset directory), as bytes.

    Each row becomes a line: rows that end in a newline (wikitext's) are kept as they are, rows
    that do not (pg19's books) get one. With a byte cap the split is streamed, so only about
    that much is downloaded.
    """
    import datasets  # a second to import, and only text and hub corpora need it

    # A local directory needs no hub; in offline mode datasets fails fast or uses its cache.
    local, offline = os.path.isdir(config.hub_path), datasets.config.HF_HUB_OFFLINE
    if not (local or offline or _reachable(datasets.config.HF_ENDPOINT)):
        raise _hub_unreachable(config.hub_path)
    try:
        rows = datasets.load_dataset(
            config.hub_path, config.hub_name, split=split, streaming=max_bytes is not None
        )
        lines = (
            text if text.endswith("\n") else text + "\n"
            for text in _column(rows, config.text_field)
        )
        return _encode(lines, max_bytes)
    except ConnectionError as error:
        raise _hub_unreachable(config.hub_path) from error
    except (FileNotFoundError, ValueError) as error:
        raise PosbenchError(
            f"cannot load split '{split}' of data.hub_path '{config.hub_path}' "
            f"(data.hub_name={config.hub_name}): {str(error).splitlines()[0]}"
        ) from error


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
