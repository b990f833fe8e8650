"""Data: corpora as bytes (the synthetic default, local text files, hub corpora) and tasks
that generate prompts with answers (passkey, copy, recall; the RULER-style tasks and flip-flop;
the algorithmic suites).

Every corpus is a train and a validation stream of bytes (uint8 arrays), cached on disk so a
second run neither re-generates nor re-reads it and memory-mapped from there, so it may be
larger than memory, plus a few reference numbers in ``stats`` and, where the source has
documents (the files of a text directory or glob, pg19's books), where each document of a
split starts. One module per source:
``synthetic`` (the default, see its docstring), ``text`` (local files), ``hub`` (``datasets``
corpora), each writing its splits as it produces them; ``cache`` stores what they write;
``corpus`` holds the ``Corpus`` type, its windows and training batches; ``task`` the ``Task``
interface that ``passkey``, ``copying`` and ``recall`` implement (``WindowTask``), as do the
RULER-style tasks (``niah``, ``variable_tracking``, ``common_words``, ``freq_words``, sharing
``haystack``) and ``flip_flop``, and the package ``algorithmic`` (``AlgorithmicTask``, one
module per task). ``load_data`` gives either, ``load_corpus`` a corpus.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from posbench.data.algorithmic import (
    ALGORITHMIC_SCHEMAS,
    ALGORITHMIC_TASKS,
    AlgorithmicDataConfig,
    AlgorithmicTask,
)
from posbench.data.cache import build_entry, entry_path, read_entry, verify_entry
from posbench.data.common_words import CommonWordsDataConfig, CommonWordsTask
from posbench.data.copying import CopyDataConfig, CopyTask
from posbench.data.corpus import (
    MIN_SPLIT_BYTES,
    Bytes,
    Corpus,
    Offsets,
    SplitWriter,
    check_documents,
    gather_windows,
    sample_batch,
    sample_positions,
    unigram_bits,
    unigram_bits_per_byte,
)
from posbench.data.flip_flop import FlipFlopDataConfig, FlipFlopTask
from posbench.data.freq_words import FreqWordsDataConfig, FreqWordsTask
from posbench.data.hub import HubDataConfig, _check_hub_available, _write_hub
from posbench.data.niah import NiahDataConfig, NiahTask
from posbench.data.passkey import PasskeyDataConfig, PasskeyTask
from posbench.data.recall import RecallDataConfig, RecallTask
from posbench.data.synthetic import (
    ALPHABET,
    SEPARATOR,
    CopyMarkovProcess,
    DocumentMarkovProcess,
    SpanMarkovProcess,
    SyntheticDataConfig,
    _write_synthetic,
)
from posbench.data.task import IGNORE, AnswerMode, Examples, Task, WindowTask
from posbench.data.text import TextDataConfig, _check_held_out, _text_file_stamps, _write_text
from posbench.data.tokenizer import BYTES, TokenizerOptions, byte_is_whitespace, tokenized_corpus
from posbench.data.variable_tracking import VariableTrackingDataConfig, VariableTrackingTask
from posbench.errors import PosbenchError

__all__ = [
    "ALGORITHMIC_TASKS",
    "ALPHABET",
    "DATA_SCHEMAS",
    "IGNORE",
    "MIN_SPLIT_BYTES",
    "RULER_TASKS",
    "SEPARATOR",
    "TASKS",
    "WINDOW_TASKS",
    "AlgorithmicTask",
    "AnswerMode",
    "Bytes",
    "CopyMarkovProcess",
    "Corpus",
    "DataConfig",
    "DocumentMarkovProcess",
    "Examples",
    "HubDataConfig",
    "Offsets",
    "SpanMarkovProcess",
    "SyntheticDataConfig",
    "Task",
    "TextDataConfig",
    "WindowTask",
    "byte_is_whitespace",
    "check_data",
    "gather_windows",
    "load_corpus",
    "load_data",
    "sample_batch",
    "sample_positions",
    "unigram_bits_per_byte",
    "verify_corpus",
]

log = logging.getLogger(__name__)

# The task sources, each built from its config (a ``data.source`` not here is a corpus).
WINDOW_TASKS: dict[str, type[Task]] = {
    "passkey": PasskeyTask,
    "copy": CopyTask,
    "recall": RecallTask,
}
# RULER's synthetic tasks at byte level (posbench/data/haystack.py), and flip-flop: window
# tasks too, apart from the retrieval experiment's three.
RULER_TASKS: dict[str, type[Task]] = {
    "niah": NiahTask,
    "variable_tracking": VariableTrackingTask,
    "common_words": CommonWordsTask,
    "freq_words": FreqWordsTask,
}
TASKS: dict[str, type[Task]] = {
    **WINDOW_TASKS,
    **RULER_TASKS,
    "flip_flop": FlipFlopTask,
    **ALGORITHMIC_TASKS,
}

DATA_SCHEMAS = {
    "synthetic": SyntheticDataConfig,
    "text": TextDataConfig,
    "hub": HubDataConfig,
    "passkey": PasskeyDataConfig,
    "copy": CopyDataConfig,
    "recall": RecallDataConfig,
    "niah": NiahDataConfig,
    "variable_tracking": VariableTrackingDataConfig,
    "common_words": CommonWordsDataConfig,
    "freq_words": FreqWordsDataConfig,
    "flip_flop": FlipFlopDataConfig,
    **ALGORITHMIC_SCHEMAS,
}

DataConfig = (
    SyntheticDataConfig
    | TextDataConfig
    | HubDataConfig
    | PasskeyDataConfig
    | CopyDataConfig
    | RecallDataConfig
    | NiahDataConfig
    | VariableTrackingDataConfig
    | CommonWordsDataConfig
    | FreqWordsDataConfig
    | FlipFlopDataConfig
    | AlgorithmicDataConfig
)


# Each source writes the train and val bytes of a config as it produces them, and returns
# its own stats.
_BUILDERS: dict[str, Callable[[Any, SplitWriter, SplitWriter], dict[str, float]]] = {
    "synthetic": _write_synthetic,
    "text": _write_text,
    "hub": _write_hub,
}

# The sources whose bytes are not text: a synthetic corpus is a Markov chain over bytes, whose
# whitespace bytes delimit no words, so a word perplexity of it would mean nothing (its
# "words" are a few bytes apart, and it was 2.4e32).
WORDLESS_SOURCES = {"synthetic"}

SPLITS = ("train", "val")  # the arrays of a corpus's cache entry
DOCUMENTS = ("train_documents", "val_documents")  # and theirs, for a source with documents


def load_corpus(cfg: Mapping[str, Any] | DictConfig) -> Corpus:
    """The corpus a ``data`` config describes, memory-mapped from the cache (built first when
    the cache does not hold it).

    ``cfg`` is the composed ``data`` node, or a plain mapping with the same keys (missing keys
    take the defaults of the schema that ``cfg["source"]`` names). ``stats`` always holds
    ``unigram_bits_per_byte``: the cross-entropy on val of a byte unigram fitted on train
    (add-one smoothed), the baseline any model should beat. Synthetic corpora also hold
    ``entropy_floor_bits_per_byte``, the best bits per byte any model can reach on val.
    """
    config = _corpus_config(cfg)
    entry = _checked_entry(config)
    corpus = _read_corpus(entry, config.name)
    if corpus is None:
        if isinstance(config, HubDataConfig):
            _check_hub_available(config.hub_path)
        log.info("building corpus %r into %s", config.name, entry)
        _build(config, entry)
        corpus = _read_corpus(entry, config.name)
        assert corpus is not None, f"{entry} was just built"
    corpus.has_words = config.source not in WORDLESS_SOURCES
    if getattr(config, "tokenizer", BYTES) == BYTES:
        return corpus
    return tokenized_corpus(corpus, entry, config.tokenizer, config.vocab_size, config.cache_dir)


def check_data(cfg: Mapping[str, Any] | DictConfig) -> None:
    """Refuse, before anything is built or trained, what loading a ``data`` config would refuse
    before reading any data: a ``data.path`` or ``data.val_path`` that matches no file, a
    ``data.val_path`` inside ``data.path``."""
    config = _typed_config(cfg)
    if config.source not in TASKS:
        _checked_entry(config)


def _checked_entry(config: DataConfig) -> Path:
    """The cache entry of the corpus of ``config``, once its files are found (and a
    ``data.val_path`` held out: checked before the cache, since a cached corpus is never
    rebuilt)."""
    if isinstance(config, TextDataConfig) and config.val_path is not None:
        _check_held_out(config)
    return _cache_entry(config)


def verify_corpus(cfg: Mapping[str, Any] | DictConfig) -> list[str]:
    """The arrays of a ``data`` config's cache entry whose SHA-256 no longer matches the one
    taken when it was built (``[]``: all intact). Loading checks sizes only; this reads the
    whole entry."""
    entry = _cache_entry(_corpus_config(cfg))
    try:
        return verify_entry(entry)
    except (OSError, ValueError, KeyError) as error:
        raise PosbenchError(
            f"no intact cache entry at {entry} to verify ({error}); load the corpus to build it"
        ) from error


def load_data(cfg: Mapping[str, Any] | DictConfig) -> Corpus | Task:
    """The corpus or the task a ``data`` config describes (see ``load_corpus``)."""
    config = _typed_config(cfg)
    if config.source in TASKS:
        return TASKS[config.source](config)
    return load_corpus(cfg)


def _cache_entry(config: DataConfig) -> Path:
    """The cache entry of the corpus of ``config``, keyed by everything that determines its
    bytes: the config (its name and cache_dir aside) and, for local text, each file's path,
    size and mtime."""
    # The tokenizer's keys are not the bytes': corpora of every tokenizer share one byte entry.
    ignored = ("name", "cache_dir", *(field.name for field in fields(TokenizerOptions)))
    inputs = {k: v for k, v in asdict(config).items() if k not in ignored}
    if isinstance(config, TextDataConfig):
        inputs["files"] = _text_file_stamps(config)
    return entry_path(config.cache_dir, config.source, inputs)


def _build(config: DataConfig, entry: Path) -> None:
    """Write the corpus of ``config`` to the cache ``entry``, one chunk at a time."""
    if config.max_bytes is not None and config.max_bytes < MIN_SPLIT_BYTES:
        raise PosbenchError(
            f"data.max_bytes must be null or at least {MIN_SPLIT_BYTES} (got {config.max_bytes})"
        )
    with build_entry(entry) as build:
        train, val = (SplitWriter(build.array(split)) for split in SPLITS)
        stats = _BUILDERS[config.source](config, train, val)
        for split, data in zip(SPLITS, (train, val), strict=True):
            if len(data) < MIN_SPLIT_BYTES:
                raise PosbenchError(
                    f"the {split} split of data '{config.name}' has {len(data)} bytes, fewer "
                    f"than the {MIN_SPLIT_BYTES} needed; give it more data"
                )
        unigram = unigram_bits(train.counts, val.counts)
        build.meta["stats"] = {"unigram_bits_per_byte": unigram, **stats}
        for split, data in zip(SPLITS, (train, val), strict=True):
            if data.documents is not None:
                build.write_array(f"{split}_documents", data.documents)


def _read_corpus(entry: Path, name: str) -> Corpus | None:
    """The corpus cached at ``entry`` with its documents, if the source has them (None: to be
    built; document starts that are not offsets into their split also mean a rebuild)."""
    cached = read_entry(entry, SPLITS, DOCUMENTS, _check_corpus_documents)
    if cached is None:
        return None
    arrays, meta = cached
    documents = {key: arrays.get(key) for key in DOCUMENTS}
    return Corpus(name, arrays["train"], arrays["val"], meta["stats"], **documents)


def _check_corpus_documents(arrays: dict[str, np.ndarray]) -> None:
    for split, documents in zip(SPLITS, DOCUMENTS, strict=True):
        if documents in arrays:
            check_documents(arrays[documents], len(arrays[split]))


def _corpus_config(cfg: Mapping[str, Any] | DictConfig) -> DataConfig:
    config = _typed_config(cfg)
    if config.source in TASKS:
        raise PosbenchError(
            f"data={config.source} is a task that generates prompts, not a corpus of text; "
            "this needs a run trained on a corpus (data=synthetic, text, wikitext2, ...)"
        )
    return config


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
