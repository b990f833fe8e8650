"""The synthetic default corpus: a sparse Markov chain mixed with copies from fixed lags.

It exists to make length extrapolation measurable. Each symbol of a small printable alphabet is
drawn in one of two ways. With probability ``1 - copy_prob`` it follows a sparse order-1 Markov
chain (each symbol has ``successors`` possible successors, with random weights); with
probability ``copy_prob`` it copies the symbol ``d`` positions back, ``d`` drawn
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

from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from posbench.data.corpus import SplitWriter
from posbench.errors import PosbenchError


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
    max_bytes: int | None = None  # per split: at most this many of train_tokens / val_tokens
    cache_dir: str | None = None


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


def _write_synthetic(
    config: SyntheticDataConfig, train: SplitWriter, val: SplitWriter
) -> dict[str, float]:
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
    n_train, n_val = (
        min(n, config.max_bytes or n) for n in (config.train_tokens, config.val_tokens)
    )
    train_stream = process.sample(n_train, np.random.default_rng(train_seed))
    val_stream = process.sample(n_val, np.random.default_rng(val_seed))
    alphabet = np.frombuffer(ALPHABET, dtype=np.uint8)
    train.write(alphabet[train_stream[process.burn_in :]])
    val.write(alphabet[val_stream[process.burn_in :]])
    return {"entropy_floor_bits_per_byte": float(process.bits(val_stream).mean())}


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
