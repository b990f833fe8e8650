"""A corpus (train and validation bytes, with their documents when the source has them), the
windows cut from it, and the writer it is built with.

A corpus's splits are uint8 numpy arrays, normally read-only memory maps of its cache entry
(posbench/data/cache.py), so they may be larger than memory: everything here reads the windows
it needs and never the whole split, and gathers with numpy (torch will not wrap read-only
memory) before handing torch the small batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from posbench.data.cache import CHUNK_BYTES, ArrayWriter
from posbench.errors import PosbenchError

# 1-D bytes: a numpy array (a corpus split, maybe a memory map) or a CPU tensor.
Bytes = np.ndarray | torch.Tensor
# Int64 offsets into a split, such as where its documents start: a numpy array or a tensor.
Offsets = np.ndarray | torch.Tensor

# A split this short cannot fill even a few training windows or evaluation lengths.
MIN_SPLIT_BYTES = 1024


@dataclass
class Corpus:
    name: str
    train: np.ndarray  # uint8 (N,) bytes or uint16/32 token ids, a read-only memory map
    val: np.ndarray  # (M,), the same
    stats: dict[str, float] = field(default_factory=dict)
    # Where each document of a split starts (int64, first 0, increasing: ``document_starts``);
    # None for a source that is one stream (synthetic, a single text file, wikitext).
    train_documents: np.ndarray | None = None
    val_documents: np.ndarray | None = None
    # A corpus of tokens (data.tokenizer other than bytes): its vocabulary, the tokenizer's
    # JSON, and each val token's bytes of text and word starts (posbench/data/tokenizer.py).
    # A byte corpus has none of these: each token is a byte, its words follow from the bytes.
    vocab_size: int = 256
    tokenizer: str | None = None
    val_token_bytes: np.ndarray | None = None
    val_word_starts: np.ndarray | None = None
    # Whether its bytes are text, whose whitespace delimits words (word_ppl): not a synthetic
    # corpus's (posbench.data.WORDLESS_SOURCES).
    has_words: bool = True

    def train_batch(
        self, batch_size: int, seq_len: int, generator: torch.Generator, step: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Random windows of the train split (``sample_batch``), the same at every ``step``."""
        return sample_batch(self.train, batch_size, seq_len, generator)

    def describe(self) -> str:
        unit = "bytes" if self.tokenizer is None else f"tokens (vocabulary {self.vocab_size:,})"
        parts = [f"{len(self.train):,} train / {len(self.val):,} val {unit}"]
        for split, starts in (("train", self.train_documents), ("val", self.val_documents)):
            if starts is not None:
                parts.append(f"{len(starts):,} {split} documents")
        return ", ".join(parts)


def gather_windows(tokens: Bytes, starts: Sequence[int] | np.ndarray, width: int) -> torch.Tensor:
    """``tokens[s : s + width]`` for each of ``starts`` -> (len(starts), width) int64.

    Only those bytes are read and copied, so ``tokens`` may be a memory map far larger than
    memory."""
    index = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(width)  # (B, width)
    return torch.from_numpy(np.asarray(tokens)[index].astype(np.int64))


def document_starts(sizes: Sequence[int]) -> np.ndarray:
    """The offsets (int64) at which documents of ``sizes`` bytes start once concatenated;
    empty documents start none, so the offsets are increasing and the first is 0."""
    sizes = np.asarray(sizes, dtype=np.int64)
    return (np.cumsum(sizes) - sizes)[sizes > 0]


def documents_between(starts: np.ndarray, begin: int, end: int) -> np.ndarray:
    """The documents of bytes [begin, end) of a stream whose documents start at ``starts``, as
    offsets from ``begin``: a document the cut at ``begin`` falls inside keeps its part after
    the cut as a document, which starts at 0."""
    inside = starts[(starts > begin) & (starts < end)] - begin
    return np.concatenate([np.zeros(1, dtype=np.int64), inside])


def check_documents(starts: np.ndarray, n_bytes: int) -> None:
    """Raise ValueError unless ``starts`` are document starts of a split of ``n_bytes`` bytes:
    int64 offsets into it, the first 0, strictly increasing."""
    if starts.dtype != np.int64 or starts.ndim != 1 or not len(starts):
        raise ValueError("document starts are not a non-empty int64 array")
    if starts[0] != 0 or starts[-1] >= n_bytes or np.any(np.diff(starts) <= 0):
        raise ValueError("document starts are not increasing offsets into the split")


def sample_batch(
    tokens: Bytes, batch_size: int, seq_len: int, generator: torch.Generator
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
    rows = gather_windows(tokens, starts.numpy(), seq_len + 1)  # (B, T+1)
    return rows[:, :-1], rows[:, 1:]


def sample_positions(
    n_positions: int,
    batch_size: int,
    seq_len: int,
    generator: torch.Generator,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """Randomized positions (Ruoss et al. 2023, https://arxiv.org/abs/2305.16843): for each of
    ``batch_size`` sequences its own sorted random subset of ``seq_len`` distinct positions from
    [0, n_positions) -> (batch_size, seq_len) int64, drawn from ``generator`` alone, so a run's
    positions are reproducible from its state. With ``lengths`` (batch_size,) int64, row b is a
    sequence of lengths[b] tokens padded to seq_len: its first lengths[b] columns hold a sorted
    uniform subset of that many positions (spread over all of [0, n_positions) whatever the
    padding), the padding repeats its last position (0 in a row of length 0)."""
    # The seq_len largest of n_positions uniform draws are at a uniformly random subset of
    # their indices: one call for the whole batch, where randperm is one call per sequence.
    draws = torch.rand(batch_size, n_positions, generator=generator)
    largest = draws.topk(seq_len, dim=1).indices  # (B, T), the largest draw first
    if lengths is None:
        return largest.sort(dim=1).values
    # A row's first lengths[b] of them are its lengths[b] largest draws: a uniform subset too.
    own = torch.arange(seq_len) < lengths[:, None]  # (B, T)
    ordered = largest.masked_fill(~own, n_positions).sort(dim=1).values  # its subset first
    last = ordered.masked_fill(~own, 0).amax(dim=1, keepdim=True)  # (B, 1)
    return torch.where(own, ordered, last)


def byte_counts(tokens: Bytes) -> np.ndarray:
    """(256,) int64: how often each byte value occurs, counted a chunk at a time (bincount
    would otherwise widen the whole split to int64 at once)."""
    tokens = np.asarray(tokens)
    counts = np.zeros(256, dtype=np.int64)
    for start in range(0, len(tokens), CHUNK_BYTES):
        counts += np.bincount(tokens[start : start + CHUNK_BYTES], minlength=256)
    return counts


def unigram_bits(train_counts: np.ndarray, val_counts: np.ndarray) -> float:
    """Cross-entropy (bits) on bytes counted ``val_counts`` of the byte distribution counted
    ``train_counts``, add-one smoothed over all 256 bytes so a byte unseen in train costs
    finite bits."""
    smoothed = train_counts + 1.0
    bits = -np.log2(smoothed / smoothed.sum())
    return float(bits @ val_counts / val_counts.sum())


def unigram_bits_per_byte(train: Bytes, val: Bytes) -> float:
    """``unigram_bits`` of the byte counts of ``train`` and ``val``."""
    return unigram_bits(byte_counts(train), byte_counts(val))


class SplitWriter:
    """One split of a corpus being built: bytes appended to its cache file, counted on the way
    (``counts``, for the unigram baseline), so building never holds the split. A source with
    documents says where they start (``set_documents``)."""

    def __init__(self, array: ArrayWriter) -> None:
        self.array = array
        self.counts = np.zeros(256, dtype=np.int64)
        self.documents: np.ndarray | None = None  # None: one stream

    def set_documents(self, sizes: Sequence[int]) -> None:
        """The bytes written are documents of ``sizes`` bytes, in order. A byte cap that
        stopped the writing keeps the head of the document it cut; the ones after are dropped."""
        assert sum(sizes) >= len(self), "the documents cover every byte written"
        starts = document_starts(sizes)
        self.documents = starts[starts < len(self)]

    def __len__(self) -> int:
        return len(self.array)

    def write(self, data: bytes | np.ndarray) -> None:
        data = np.frombuffer(data, dtype=np.uint8) if isinstance(data, bytes) else data
        self.array.write(data)
        self.counts += byte_counts(data)

    def move_tail(self, count: int, into: SplitWriter) -> None:
        """Move the last ``count`` bytes to the end of ``into`` (a split held out of this one).
        With documents, ``into`` must be empty: the document the cut falls inside leaves its
        tail as ``into``'s first document (``documents_between``)."""
        keep = len(self) - count
        if self.documents is not None:
            assert not len(into), "documents move into an empty split"
            into.documents = documents_between(self.documents, keep, len(self))
            self.documents = documents_between(self.documents, 0, keep)
        for chunk in self.array.read(keep, len(self)):
            into.write(chunk)
            self.counts -= byte_counts(chunk)
        self.array.truncate(keep)

    def clear(self) -> None:
        self.array.truncate(0)
        self.counts[:] = 0
        self.documents = None
