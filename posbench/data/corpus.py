"""A corpus (train and validation bytes), the windows cut from it, and the writer it is built
with.

A corpus's splits are uint8 numpy arrays, normally read-only memory maps of its cache entry
(posbench/data/cache.py), so they may be larger than memory: everything here reads the windows
it needs and never the whole split, and gathers with numpy (torch will not wrap read-only
memory) before handing torch the small batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from posbench.errors import PosbenchError

if TYPE_CHECKING:
    from posbench.data.cache import ArrayWriter

# 1-D bytes: a numpy array (a corpus split, maybe a memory map) or a CPU tensor.
Bytes = np.ndarray | torch.Tensor

# A split this short cannot fill even a few training windows or evaluation lengths.
MIN_SPLIT_BYTES = 1024

# Building streams bytes in chunks of about this size, so it holds about this much at once.
CHUNK_BYTES = 1 << 20


@dataclass
class Corpus:
    name: str
    train: np.ndarray  # uint8 (N,), a read-only memory map when loaded from the cache
    val: np.ndarray  # uint8 (M,), the same
    stats: dict[str, float] = field(default_factory=dict)

    def train_batch(
        self, batch_size: int, seq_len: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Random windows of the train split (``sample_batch``)."""
        return sample_batch(self.train, batch_size, seq_len, generator)

    def describe(self) -> str:
        return f"{len(self.train):,} train / {len(self.val):,} val bytes"


def gather_windows(tokens: Bytes, starts: Sequence[int] | np.ndarray, width: int) -> torch.Tensor:
    """``tokens[s : s + width]`` for each of ``starts`` -> (len(starts), width) int64.

    Only those bytes are read and copied, so ``tokens`` may be a memory map far larger than
    memory."""
    index = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(width)  # (B, width)
    return torch.from_numpy(np.asarray(tokens)[index].astype(np.int64))


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


def sample_positions(n_positions: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
    """Randomized positions (Ruoss et al. 2023, https://arxiv.org/abs/2305.16843): a sorted
    random subset of ``seq_len`` distinct positions from [0, n_positions) -> (seq_len,) int64,
    drawn from ``generator`` alone, so a run's positions are reproducible from its state."""
    return torch.randperm(n_positions, generator=generator)[:seq_len].sort().values


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
    (``counts``, for the unigram baseline), so building never holds the split."""

    def __init__(self, array: ArrayWriter) -> None:
        self.array = array
        self.counts = np.zeros(256, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.array)

    def write(self, data: bytes | np.ndarray) -> None:
        data = np.frombuffer(data, dtype=np.uint8) if isinstance(data, bytes) else data
        self.array.write(data)
        self.counts += np.bincount(data, minlength=256)

    def move_tail(self, count: int, into: SplitWriter) -> None:
        """Move the last ``count`` bytes to the end of ``into`` (a split held out of this one)."""
        keep = len(self) - count
        for chunk in self.array.read(keep, len(self)):
            into.write(chunk)
            self.counts -= np.bincount(chunk, minlength=256)
        self.array.truncate(keep)

    def clear(self) -> None:
        self.array.truncate(0)
        self.counts[:] = 0
