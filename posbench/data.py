"""Corpora as byte tensors: the synthetic default, local text files, and hub corpora.

Every corpus is a train and a validation stream of bytes (uint8 tensors), cached on disk so a
second run neither re-generates nor re-reads it, plus a few reference numbers in ``stats``.

The synthetic default exists to make length extrapolation measurable. Each symbol of a small
printable alphabet is drawn in one of two ways. With probability ``1 - copy_prob`` it follows a
sparse order-1 Markov chain (each symbol has ``successors`` possible successors, with random
weights); with probability ``copy_prob`` it copies the symbol ``d`` positions back, ``d`` drawn
uniformly from ``lags``. So

    P(x_t | past) = (1 - c) T[x_{t-1}, x_t] + c mean_d [x_{t-d} == x_t]

exactly, which gives three properties a natural corpus lacks:

* stationarity: the law above does not depend on t, and a discarded burn-in lets the stream
  settle, so the ideal loss of a token does not depend on where it sits. A model's loss that
  rises with position beyond the training length is the model's failure, not the data's.
* dependencies at several distances: a model that looks only one byte back reaches the Markov
  entropy; one that sees ``max(lags)`` bytes back can also predict the copies.
* an exact entropy floor: the mean of -log2 P(x_t | past) over the validation stream is the best
  bits per byte any model can reach, so a gap to it is measured, not guessed.
"""

from __future__ import annotations

import glob
import hashlib
import io
import json
import logging
import os
import urllib.error
import urllib.request
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from posbench.atomic import atomic_write, write_json
from posbench.errors import PosbenchError

log = logging.getLogger(__name__)


@dataclass
class SyntheticDataConfig:
    name: str = "synthetic"
    source: str = "synthetic"
    seed: int = 0
    train_tokens: int = 2_000_000
    val_tokens: int = 300_000
    vocab_size: int = 32
    successors: int = 4
    copy_prob: float = 0.5
    lags: list[int] = field(default_factory=lambda: [16, 48, 96])
    cache_dir: str | None = None


@dataclass
class TextDataConfig:
    name: str = "text"
    source: str = "text"
    path: str = MISSING
    val_path: str | None = None
    val_fraction: float = 0.1
    cache_dir: str | None = None


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


DATA_SCHEMAS = {
    "synthetic": SyntheticDataConfig,
    "text": TextDataConfig,
    "hub": HubDataConfig,
}

DataConfig = SyntheticDataConfig | TextDataConfig | HubDataConfig


@dataclass
class Corpus:
    name: str
    train: torch.Tensor  # uint8 (N,)
    val: torch.Tensor  # uint8 (M,)
    stats: dict[str, float] = field(default_factory=dict)


# What a source builds: train bytes, val bytes (uint8 arrays) and its own stats.
Splits = tuple[np.ndarray, np.ndarray, dict[str, float]]

# A split this short cannot fill even a few training windows or evaluation lengths.
MIN_SPLIT_BYTES = 1024


def load_corpus(cfg: Mapping[str, Any] | DictConfig) -> Corpus:
    """The corpus a ``data`` config describes, from the cache when it holds it.

    ``cfg`` is the composed ``data`` node, or a plain mapping with the same keys (missing keys
    take the defaults of the schema that ``cfg["source"]`` names). ``stats`` always holds
    ``unigram_bits_per_byte``: the cross-entropy on val of a byte unigram fitted on train
    (add-one smoothed), the baseline any model should beat. Synthetic corpora also hold
    ``entropy_floor_bits_per_byte``, the best bits per byte any model can reach on val.
    """
    config = _typed_config(cfg)
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


def sample_batch(
    tokens: torch.Tensor, batch_size: int, seq_len: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random training windows: ``x = tokens[i : i+T]`` and ``y = tokens[i+1 : i+T+1]``.

    Returns int64 tensors of shape (batch_size, seq_len); the offsets ``i`` come from
    ``generator`` alone, so the batches are reproducible from its state.
    """
    if len(tokens) < seq_len + 1:
        raise PosbenchError(
            f"a split of {len(tokens)} bytes cannot hold one window of seq_len {seq_len} plus "
            "its target; use a shorter sequence length or more data"
        )
    starts = torch.randint(len(tokens) - seq_len, (batch_size,), generator=generator)  # (B,)
    index = starts[:, None] + torch.arange(seq_len)  # (B, T)
    return tokens[index].long(), tokens[index + 1].long()


def sample_positions(n_positions: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
    """Randomized positions (Ruoss et al. 2023, https://arxiv.org/abs/2305.16843): a sorted
    random subset of ``seq_len`` distinct positions from [0, n_positions) -> (seq_len,) int64,
    drawn from ``generator`` alone, so a run's positions are reproducible from its state."""
    return torch.randperm(n_positions, generator=generator)[:seq_len].sort().values


def unigram_bits_per_byte(train: np.ndarray, val: np.ndarray) -> float:
    """Cross-entropy (bits) on ``val`` of the byte distribution of ``train``, add-one smoothed
    over all 256 bytes so a byte unseen in train costs finite bits."""
    counts = np.bincount(train, minlength=256) + 1.0
    bits = -np.log2(counts / counts.sum())
    return float(bits[val].mean())


def _build(config: DataConfig) -> Corpus:
    train, val, stats = _BUILDERS[config.source](config)
    for split, data in (("train", train), ("val", val)):
        if len(data) < MIN_SPLIT_BYTES:
            raise PosbenchError(
                f"the {split} split of data '{config.name}' has {len(data)} bytes, fewer than "
                f"the {MIN_SPLIT_BYTES} needed; give it more data"
            )
    stats = {"unigram_bits_per_byte": unigram_bits_per_byte(train, val), **stats}
    return Corpus(config.name, torch.from_numpy(train), torch.from_numpy(val), stats)


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


# The synthetic corpus ------------------------------------------------------------------------

# Symbols become common English characters first, so samples read like text.
_COMMON = b" etaoinsrhldcumfpgwybvkxjqz.,'"
ALPHABET = _COMMON + bytes(b for b in range(32, 127) if b not in _COMMON)  # printable ASCII

# The burn-in spans this many times max(lags): one max(lags) gives every kept token its full
# history; the rest lets correlations built by chains of copies settle to their equilibrium.
_BURN_IN_LAGS = 8


@dataclass(frozen=True)
class CopyMarkovProcess:
    """The synthetic source: a sparse Markov chain mixed with copies from fixed lags.

    Symbols are integers in [0, V); ``ALPHABET`` maps them to bytes.
    """

    transition: np.ndarray  # (V, V) row-stochastic, ``successors`` non-zeros per row
    copy_prob: float
    lags: tuple[int, ...]

    @classmethod
    def random(
        cls,
        vocab_size: int,
        successors: int,
        copy_prob: float,
        lags: Iterable[int],
        rng: np.random.Generator,
    ) -> CopyMarkovProcess:
        """A process with a random chain: each symbol's successors are its successor on one random
        cycle through the whole alphabet (so every symbol is reachable from every other) plus
        ``successors - 1`` others, weighted by a flat Dirichlet draw."""
        cycle = rng.permutation(vocab_size)
        transition = np.zeros((vocab_size, vocab_size))
        for i, symbol in enumerate(cycle):
            next_on_cycle = cycle[(i + 1) % vocab_size]
            others = np.delete(np.arange(vocab_size), next_on_cycle)
            chosen = [next_on_cycle, *rng.choice(others, successors - 1, replace=False)]
            transition[symbol, chosen] = rng.dirichlet(np.ones(successors))
        return cls(transition, copy_prob, tuple(lags))

    @property
    def burn_in(self) -> int:
        """Symbols generated before the first one kept."""
        return _BURN_IN_LAGS * max(self.lags)

    def sample(self, n_tokens: int, rng: np.random.Generator) -> np.ndarray:
        """``burn_in + n_tokens`` symbols (int64); the first ``burn_in`` are to be discarded.

        All random draws are made up front with numpy; the loop over Python lists is what the
        sequential dependence leaves, about a microsecond per symbol.
        """
        n = self.burn_in + n_tokens
        copies = (rng.random(n) < self.copy_prob).tolist()
        back = np.asarray(self.lags)[rng.integers(len(self.lags), size=n)].tolist()
        uniforms = rng.random(n).tolist()
        successors = [np.flatnonzero(row).tolist() for row in self.transition]
        cdfs = [np.cumsum(row[row > 0]).tolist() for row in self.transition]
        for cdf in cdfs:
            cdf[-1] = 1.0  # rounding must never leave a uniform draw past the last successor
        stream = [int(rng.integers(len(self.transition)))]
        for t in range(1, n):
            if copies[t] and back[t] <= t:
                stream.append(stream[t - back[t]])
            else:
                prev = stream[t - 1]
                stream.append(successors[prev][bisect_right(cdfs[prev], uniforms[t])])
        return np.asarray(stream)

    def bits(self, stream: np.ndarray) -> np.ndarray:
        """-log2 P(x_t | past) of every symbol after the burn-in: the ideal loss per token."""
        t0, n = self.burn_in, len(stream)
        current = stream[t0:]
        markov = self.transition[stream[t0 - 1 : n - 1], current]
        copied = np.mean([stream[t0 - d : n - d] == current for d in self.lags], axis=0)
        return -np.log2((1 - self.copy_prob) * markov + self.copy_prob * copied)


def _synthetic_splits(config: SyntheticDataConfig) -> Splits:
    """Train and val as independent streams of one process; the floor is measured on val."""
    _check_synthetic(config)
    process_seed, train_seed, val_seed = np.random.SeedSequence(config.seed).spawn(3)
    process = CopyMarkovProcess.random(
        config.vocab_size,
        config.successors,
        config.copy_prob,
        config.lags,
        np.random.default_rng(process_seed),
    )
    train = process.sample(config.train_tokens, np.random.default_rng(train_seed))
    val = process.sample(config.val_tokens, np.random.default_rng(val_seed))
    alphabet = np.frombuffer(ALPHABET, dtype=np.uint8)
    floor = float(process.bits(val).mean())
    return (
        alphabet[train[process.burn_in :]],
        alphabet[val[process.burn_in :]],
        {"entropy_floor_bits_per_byte": floor},
    )


def _check_synthetic(config: SyntheticDataConfig) -> None:
    if not 2 <= config.vocab_size <= len(ALPHABET):
        raise PosbenchError(
            f"data.vocab_size must be between 2 and {len(ALPHABET)} (got {config.vocab_size})"
        )
    if not 1 <= config.successors <= config.vocab_size:
        raise PosbenchError(
            f"data.successors must be between 1 and data.vocab_size={config.vocab_size} "
            f"(got {config.successors})"
        )
    if not 0 <= config.copy_prob < 1:
        raise PosbenchError(f"data.copy_prob must be in [0, 1) (got {config.copy_prob})")
    if not config.lags or min(config.lags) <= 0:
        raise PosbenchError(
            f"data.lags must be a non-empty list of positive integers (got {config.lags})"
        )
    counts = {"train_tokens": config.train_tokens, "val_tokens": config.val_tokens}
    for key, count in counts.items():
        if count <= 0:
            raise PosbenchError(f"data.{key} must be positive (got {count})")


# Local text ----------------------------------------------------------------------------------


def _text_splits(config: TextDataConfig) -> Splits:
    """Train from ``path``; val from ``val_path``, else the last ``val_fraction`` of the bytes."""
    if config.val_path is not None:
        return _read_text(config.path, "path"), _read_text(config.val_path, "val_path"), {}
    if not 0 < config.val_fraction < 1:
        raise PosbenchError(f"data.val_fraction must be in (0, 1) (got {config.val_fraction})")
    train = _read_text(config.path, "path")
    split = len(train) - round(len(train) * config.val_fraction)
    return train[:split], train[split:], {}


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


def _read_text(pattern: str, key: str) -> np.ndarray:
    """The files of ``data.<key>`` concatenated like ``cat``, as UTF-8 bytes (raw bytes when
    they are not UTF-8 text).

    datasets' text builder keeps every line break but reads in universal-newline mode, so
    ``\\r\\n`` and ``\\r`` arrive as ``\\n``. Streaming reads the files directly, without
    writing an Arrow copy next to the cache entry this corpus gets anyway.
    """
    import datasets  # a second to import, and only text and hub corpora need it

    files = [str(f) for f in _text_files(pattern, key)]
    rows = datasets.load_dataset(
        "text", data_files=files, split="train", keep_linebreaks=True, streaming=True
    )
    try:
        data = _encode(_column(rows, "text"))
    except UnicodeDecodeError:
        # The model reads bytes, so any file is a corpus: one that is not UTF-8 text (a binary
        # file, Latin-1 text) is taken byte for byte, with no newline translation.
        log.warning("data.%s '%s' is not UTF-8 text: training on its raw bytes", key, pattern)
        data = np.concatenate([np.fromfile(f, dtype=np.uint8) for f in files])
    if not len(data):
        raise PosbenchError(
            f"data.{key} '{pattern}' contains no text; point it at a non-empty text file"
        )
    return data


# Hub corpora ---------------------------------------------------------------------------------


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
    hf_home = Path(os.environ.get("HF_HOME", _xdg_cache_home() / "huggingface"))
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


def _encode(texts: Iterable[str], max_bytes: int | None = None) -> np.ndarray:
    """``texts`` joined as UTF-8 bytes (uint8), cut at ``max_bytes``, reading no further."""
    chunks, size = [], 0
    for text in texts:
        chunks.append(text.encode("utf-8"))
        size += len(chunks[-1])
        if max_bytes is not None and size >= max_bytes:
            break
    return np.frombuffer(bytearray().join(chunks), dtype=np.uint8)[:max_bytes]


_BUILDERS: dict[str, Callable[[Any], Splits]] = {
    "synthetic": _synthetic_splits,
    "text": _text_splits,
    "hub": _hub_splits,
}


# The cache -----------------------------------------------------------------------------------

# Bump when the bytes a config produces change (a new generator, a new joining rule).
_CACHE_FORMAT = 1


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

    ``meta.json`` is written last and records each split's length and SHA-256, so a partly
    written or damaged entry is rebuilt instead of trusted.
    """
    try:
        meta = json.loads((entry / "meta.json").read_text())
        splits = {}
        for split in ("train", "val"):
            data = np.load(entry / f"{split}.npy", allow_pickle=False)
            if data.dtype != np.uint8 or data.ndim != 1 or _digest(data) != meta[split]:
                raise ValueError(f"{split} split does not match its checksum")
            splits[split] = torch.from_numpy(data)
        return Corpus(name, splits["train"], splits["val"], meta["stats"])
    except FileNotFoundError:
        return None
    except (OSError, EOFError, ValueError, KeyError, TypeError) as error:
        log.warning("rebuilding damaged cache entry %s (%s)", entry, error)
        return None


def _write_cache(entry: Path, corpus: Corpus) -> None:
    """Store ``corpus`` at ``entry``, its ``meta.json`` last (see ``_read_cache``)."""
    splits = {"train": corpus.train.numpy(), "val": corpus.val.numpy()}
    try:
        for split, data in splits.items():
            atomic_write(entry / f"{split}.npy", _npy_bytes(data))
        digests = {split: _digest(data) for split, data in splits.items()}
        write_json(entry / "meta.json", {"stats": corpus.stats, **digests})
    except OSError as error:
        raise PosbenchError(
            f"cannot write the data cache {entry} ({error.strerror}); "
            "set data.cache_dir or POSBENCH_CACHE to a writable directory"
        ) from error


def _npy_bytes(data: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, data)
    return buffer.getvalue()


def _digest(data: np.ndarray) -> dict[str, Any]:
    return {"bytes": len(data), "sha256": hashlib.sha256(data.data).hexdigest()}
