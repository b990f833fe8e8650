"""A corpus (train and validation byte tensors) and the random training windows cut from it."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from posbench.errors import PosbenchError


@dataclass
class Corpus:
    name: str
    train: torch.Tensor  # uint8 (N,)
    val: torch.Tensor  # uint8 (M,)
    stats: dict[str, float] = field(default_factory=dict)

    def train_batch(
        self, batch_size: int, seq_len: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Random windows of the train split (``sample_batch``)."""
        return sample_batch(self.train, batch_size, seq_len, generator)

    def describe(self) -> str:
        return f"{len(self.train):,} train / {len(self.val):,} val bytes"


# What a source builds: train bytes, val bytes (uint8 arrays) and its own stats.
Splits = tuple[np.ndarray, np.ndarray, dict[str, float]]

# A split this short cannot fill even a few training windows or evaluation lengths.
MIN_SPLIT_BYTES = 1024


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
