"""Data: corpora as byte tensors (the synthetic default, local text files, hub corpora) and
tasks (passkey, copy, recall) that generate prompts with answers.

Every corpus is a train and a validation stream of bytes (uint8 tensors), cached on disk so a
second run neither re-generates nor re-reads it, plus a few reference numbers in ``stats`` and,
where the source has documents (the files of a text directory or glob, pg19's books), where
each document of a split starts.
One module per source: ``synthetic`` (the default, see its docstring), ``text`` (local files),
``hub`` (``datasets`` corpora); ``cache`` stores what they build; ``corpus`` holds the
``Corpus`` type and training batches; ``task`` the ``Task`` interface that ``passkey``,
``copying`` and ``recall`` implement. ``load_data`` gives either, ``load_corpus`` a corpus.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from posbench.data.cache import _cache_key, _cache_root, _read_cache, _write_cache
from posbench.data.copying import CopyDataConfig, CopyTask
from posbench.data.corpus import (
    MIN_SPLIT_BYTES,
    Corpus,
    Splits,
    sample_batch,
    sample_positions,
    unigram_bits_per_byte,
)
from posbench.data.hub import HubDataConfig, _check_hub_available, _hub_splits
from posbench.data.passkey import PasskeyDataConfig, PasskeyTask
from posbench.data.recall import RecallDataConfig, RecallTask
from posbench.data.synthetic import (
    ALPHABET,
    CopyMarkovProcess,
    SyntheticDataConfig,
    _synthetic_splits,
)
from posbench.data.task import IGNORE, Examples, Task
from posbench.data.text import TextDataConfig, _check_held_out, _text_splits
from posbench.errors import PosbenchError

__all__ = [
    "ALPHABET",
    "DATA_SCHEMAS",
    "IGNORE",
    "MIN_SPLIT_BYTES",
    "TASKS",
    "CopyMarkovProcess",
    "Corpus",
    "DataConfig",
    "Examples",
    "HubDataConfig",
    "SyntheticDataConfig",
    "Task",
    "TextDataConfig",
    "load_corpus",
    "load_data",
    "sample_batch",
    "sample_positions",
    "unigram_bits_per_byte",
]

log = logging.getLogger(__name__)

# The task sources, each built from its config (a ``data.source`` not here is a corpus).
TASKS: dict[str, type[Task]] = {"passkey": PasskeyTask, "copy": CopyTask, "recall": RecallTask}

DATA_SCHEMAS = {
    "synthetic": SyntheticDataConfig,
    "text": TextDataConfig,
    "hub": HubDataConfig,
    "passkey": PasskeyDataConfig,
    "copy": CopyDataConfig,
    "recall": RecallDataConfig,
}

DataConfig = (
    SyntheticDataConfig
    | TextDataConfig
    | HubDataConfig
    | PasskeyDataConfig
    | CopyDataConfig
    | RecallDataConfig
)


_BUILDERS: dict[str, Callable[[Any], Splits]] = {
    "synthetic": _synthetic_splits,
    "text": _text_splits,
    "hub": _hub_splits,
}


def load_corpus(cfg: Mapping[str, Any] | DictConfig) -> Corpus:
    """The corpus a ``data`` config describes, from the cache when it holds it.

    ``cfg`` is the composed ``data`` node, or a plain mapping with the same keys (missing keys
    take the defaults of the schema that ``cfg["source"]`` names). ``stats`` always holds
    ``unigram_bits_per_byte``: the cross-entropy on val of a byte unigram fitted on train
    (add-one smoothed), the baseline any model should beat. Synthetic corpora also hold
    ``entropy_floor_bits_per_byte``, the best bits per byte any model can reach on val.
    """
    config = _typed_config(cfg)
    if config.source in TASKS:
        raise PosbenchError(
            f"data={config.source} is a task that generates prompts, not a corpus of text; "
            "this needs a run trained on a corpus (data=synthetic, text, wikitext2, ...)"
        )
    if isinstance(config, TextDataConfig) and config.val_path is not None:
        _check_held_out(config)  # before the cache: a cached corpus is never rebuilt
    entry = _cache_root(config) / f"{config.source}-{_cache_key(config)}"  # a directory
    corpus = _read_cache(entry, config.name)
    if corpus is None:
        if isinstance(config, HubDataConfig):
            _check_hub_available(config.hub_path)
        log.info("building corpus %r into %s", config.name, entry)
        corpus = _build(config)
        _write_cache(entry, corpus)
    return corpus


def load_data(cfg: Mapping[str, Any] | DictConfig) -> Corpus | Task:
    """The corpus or the task a ``data`` config describes (see ``load_corpus``)."""
    config = _typed_config(cfg)
    if config.source in TASKS:
        return TASKS[config.source](config)
    return load_corpus(cfg)


def _build(config: DataConfig) -> Corpus:
    splits = _BUILDERS[config.source](config)
    for split, data in (("train", splits.train), ("val", splits.val)):
        if len(data) < MIN_SPLIT_BYTES:
            raise PosbenchError(
                f"the {split} split of data '{config.name}' has {len(data)} bytes, fewer than "
                f"the {MIN_SPLIT_BYTES} needed; give it more data"
            )
    stats = {"unigram_bits_per_byte": unigram_bits_per_byte(splits.train, splits.val)}
    train_documents, val_documents = (
        None if starts is None else torch.from_numpy(starts)
        for starts in (splits.train_documents, splits.val_documents)
    )
    return Corpus(
        config.name,
        torch.from_numpy(splits.train),
        torch.from_numpy(splits.val),
        {**stats, **splits.stats},
        train_documents=train_documents,
        val_documents=val_documents,
    )


def _typed_config(cfg: Mapping[str, Any] | DictConfig) -> DataConfig:
    """``cfg`` as the dataclass its ``source`` names, with that schema's defaults and types."""
    source = cfg.get("source")
    if source not in DATA_SCHEMAS:
        raise PosbenchError(
            f"data.source must be one of {', '.join(DATA_SCHEMAS)} (got {source!r})"
        )
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(DATA_SCHEMAS[source]), cfg))
    except MissingMandatoryValue as error:
        raise PosbenchError(
            f"data.{error.full_key} must be set (data.{error.full_key}=...)"
        ) from error
    except OmegaConfBaseException as error:
        key = f"data.{error.full_key}" if error.full_key else "data"
        raise PosbenchError(f"invalid {key}: {str(error).splitlines()[0]}") from error
