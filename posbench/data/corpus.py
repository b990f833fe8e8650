"""A corpus (train and validation byte tensors, with their documents when the source has them)
and the random training windows cut from it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from posbench.errors import PosbenchError


@dataclass
class Corpus:
    name: str
    train: torch.Tensor  # uint8 (N,)
    val: torch.Tensor  # uint8 (M,)
    stats: dict[str, float] = field(default_factory=dict)
    # Where each document of a split starts (int64, first 0, increasing: ``document_starts``);
    # None for a source that is one stream (synthetic, a single text file, wikitext).
    train_documents: torch.Tensor | None = None
    val_documents: torch.Tensor | None = None

    def train_batch(
        self, batch_size: int, seq_len: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Random windows of the train split (``sample_batch``)."""
        return sample_batch(self.train, batch_size, seq_len, generator)

    def describe(self) -> str:
        parts = [f"{len(self.train):,} train / {len(self.val):,} val bytes"]
        for split, starts in (("train", self.train_documents), ("val", self.val_documents)):
            if starts is not None:
                parts.append(f"{len(starts):,} {split} documents")
        return ", ".join(parts)


class Splits(NamedTuple):
    """What a source builds: train bytes, val bytes (uint8 arrays), its own stats and, for a
    source with documents, where each split's documents start (``document_starts``)."""

    train: np.ndarray
    val: np.ndarray
    stats: dict[str, float]
    train_documents: np.ndarray | None = None
    val_documents: np.ndarray | None = None


# A split this short cannot fill even a few training windows or evaluation lengths.
MIN_SPLIT_BYTES = 1024


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
