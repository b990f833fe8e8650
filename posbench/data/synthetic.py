"""Longer than 500 lines because each of the three long-range structures below comes with the
exact floor of its own law, and a process and its floor must change together; split, a change
to a process could leave its floor, the number every result is read against, behind.

The synthetic default corpus: a sparse Markov chain with long-range structure on top, and an
exact entropy floor.

It exists to make length extrapolation measurable. Symbols of a small printable alphabet
follow a sparse order-1 Markov chain (each state has ``successors`` possible successors, with
random weights); ``long_range`` chooses what, farther back than the previous symbol, a symbol
also depends on:

* ``documents`` (the default): the stream is a run of documents, each ended by a newline, of
  mean length ``document_length``. The chain draws a symbol's group (of ``group_size``
  symbols); which symbol of the group it is follows the document's own taste, a draw from a
  flat Dirichlet(``concentration``) per group that is never shown, only used. A model learns
  the taste by counting the symbols the document has used so far, wherever they are: it
  needs no position information, only to look back (an encoding that keeps counting past
  its training length keeps gaining), and every encoding learns it (docs/data.md, "The
  synthetic data").
* ``spans``: earlier spans recur. At a symbol outside a span, a span starts with probability
  ``repeat_prob``; it copies the stream from ``d`` back, ``d`` log-uniform on
  ``repeat_distances``, for a geometric number of symbols of mean ``repeat_length``. Nothing
  marks a span: a model finds its source by matching what it has seen of it to an earlier
  stretch, as an induction head does, at any distance; a two-layer composition that the
  ``tiny`` model does not learn in the extrapolation experiment's budget (docs/data.md).
* ``lags``: copies at exact distances. With probability ``copy_prob`` a symbol copies the
  symbol ``d`` back, ``d`` uniform on ``lags``. Only an encoding that can address an exact
  offset learns these: they test positional addressing, not the use of a longer context.

Each has three properties a natural corpus lacks:

* stationarity: the law of the stream does not depend on t, and a discarded burn-in lets it
  settle, so the ideal loss of a token does not depend on where it sits in the stream. A
  model's loss that rises with position beyond the training length is the model's failure,
  not the data's.
* dependencies at several distances: a model that looks only one byte back reaches about the
  chain's entropy; one that sees farther back can predict more.
* an exact entropy floor: the mean of -log2 P(x_t | past) over the validation stream, with P
  the generating process's own probability given the whole stream before t, is the best bits
  per byte any model can reach with unlimited context, so a gap to it is measured, not
  guessed. ``documents`` has it in closed form, also for a context of L symbols as the
  evaluation gives one at length L (``DocumentMarkovProcess.bits``); ``spans`` by an exact
  forward recursion over its hidden state (inside a span or not, from which distance).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from posbench.data.corpus import SplitWriter
from posbench.errors import PosbenchError

LONG_RANGE = ("documents", "spans", "lags")  # the choices of data.long_range
SEPARATOR = b"\n"  # the byte of the symbol that ends a document (long_range=documents)


@dataclass
class SyntheticDataConfig:
    name: str = "synthetic"
    source: str = "synthetic"
    seed: int = 0
    train_tokens: int = 2_000_000
    val_tokens: int = 300_000
    vocab_size: int = 32
    successors: int = 4
    # documents: per-document tastes within groups; spans: earlier spans recur; lags: fixed lags
    long_range: str = "documents"
    group_size: int = 4  # documents: symbols per group (divides vocab_size)
    concentration: float = 0.3  # documents: the tastes' Dirichlet parameter (small: strong)
    document_length: float = 8192.0  # documents: mean length in symbols (geometric)
    repeat_prob: float = 0.02  # spans: chance that a span starts at a symbol outside one
    repeat_length: float = 32.0  # spans: a span's mean length (geometric)
    repeat_distances: list[int] = field(default_factory=lambda: [16, 2048])  # spans: min, max
    copy_prob: float = 0.5  # lags: chance that a symbol copies one from a lag
    lags: list[int] = field(default_factory=lambda: [16, 48, 96])  # lags
    max_bytes: int | None = None  # per split: at most this many of train_tokens / val_tokens
    cache_dir: str | None = None


# Symbols become common English characters first, so samples read like text.
_COMMON = b" etaoinsrhldcumfpgwybvkxjqz.,'"
ALPHABET = _COMMON + bytes(b for b in range(32, 127) if b not in _COMMON)  # printable ASCII

# The burn-in spans this many times the farthest a symbol can copy from (or a document's mean
# length): one such reach gives every kept token its full history; the rest lets correlations
# built by chains of copies settle (and the document a kept token starts in be as old as any).
_BURN_IN_REACHES = 8

# SpanMarkovProcess.bits folds its scale into the span vector past this, long before the
# vector's small entries could underflow.
_RESCALE = 2.0**64


def random_chain(states: int, successors: int, rng: np.random.Generator) -> np.ndarray:
    """A (states, states) row-stochastic matrix with ``successors`` non-zeros per row: each
    state's successor on one random cycle through all of them (so every state is reachable
    from every other) plus ``successors - 1`` others, weighted by a flat Dirichlet draw."""
    cycle = rng.permutation(states)
    transition = np.zeros((states, states))
    for i, state in enumerate(cycle):
        next_on_cycle = cycle[(i + 1) % states]
        others = np.delete(np.arange(states), next_on_cycle)
        chosen = [next_on_cycle, *rng.choice(others, successors - 1, replace=False)]
        transition[state, chosen] = rng.dirichlet(np.ones(successors))
    return transition


class _ChainStep:
    """Draws a symbol's successor under a transition matrix from a uniform draw in [0, 1):
    Python lists and bisect, about a microsecond a symbol, as the sequential loops need."""

    def __init__(self, transition: np.ndarray) -> None:
        self.successors = [np.flatnonzero(row).tolist() for row in transition]
        self.cdfs = [np.cumsum(row[row > 0]).tolist() for row in transition]
        for cdf in self.cdfs:
            cdf[-1] = 1.0  # rounding must never leave a uniform draw past the last successor

    def __call__(self, previous: int, uniform: float) -> int:
        return self.successors[previous][bisect_right(self.cdfs[previous], uniform)]


@dataclass(frozen=True)
class DocumentMarkovProcess:
    """``long_range=documents``: documents, each with its own taste within groups of symbols.

    The V symbols form V / k groups of ``group_size`` k consecutive symbols. A sparse Markov
    chain over the groups draws each symbol's group from the previous symbol's. Which symbol
    of its group it is, the document decides: each document draws, for every group, its own
    distribution over the group's symbols from a flat Dirichlet(``concentration``), so that it
    uses a few symbols of a group much more than the others, as a text uses a few words of its
    topic. After each symbol the document ends with probability 1 / ``document_length``,
    which the separator (symbol V) marks; the symbol after it is uniform over the alphabet.
    Symbols are integers in [0, V]; ``ALPHABET`` and ``SEPARATOR`` map them to bytes.

    The distributions are never seen, only their draws, so P(x_t | past) is the chain's
    T[g(x_{t-1}), g(x_t)] times the Dirichlet posterior's (n_x + beta) / (n_g + k beta), where
    n_x and n_g count x_t and the symbols of its group among the document's symbols before t:
    counting needs no position, only looking back over the document, and the farther a model
    looks back (up to the separator), the closer to the floor it gets.
    """

    transition: np.ndarray  # (G, G) row-stochastic, ``successors`` non-zeros per row
    group_size: int
    concentration: float
    document_length: float  # mean, in symbols

    @classmethod
    def random(
        cls,
        vocab_size: int,
        successors: int,
        group_size: int,
        concentration: float,
        document_length: float,
        rng: np.random.Generator,
    ) -> DocumentMarkovProcess:
        """A process with a random chain over the groups (``random_chain``)."""
        chain = random_chain(vocab_size // group_size, successors, rng)
        return cls(chain, group_size, concentration, document_length)

    @property
    def separator(self) -> int:
        """The symbol that ends a document: V, one past the alphabet's symbols."""
        return len(self.transition) * self.group_size

    @property
    def burn_in(self) -> int:
        """Symbols generated before the first one kept (the stream starts a document)."""
        return math.ceil(_BURN_IN_REACHES * self.document_length)

    def sample(self, n_tokens: int, rng: np.random.Generator) -> np.ndarray:
        """``burn_in + n_tokens`` symbols (int64); the first ``burn_in`` are to be discarded.

        The draws of every symbol are made up front with numpy, a document's distributions
        when it starts."""
        n, k, groups = self.burn_in + n_tokens, self.group_size, len(self.transition)
        ends = (rng.random(n) < 1 / self.document_length).tolist()
        group_uniforms, symbol_uniforms = rng.random((2, n)).tolist()
        step = _ChainStep(self.transition)
        stream, tastes = [self.separator], []
        for t in range(1, n):
            previous = stream[-1]
            if previous == self.separator:
                tastes = self._document_tastes(rng)
                group = int(group_uniforms[t] * groups)
            elif ends[t]:
                stream.append(self.separator)
                continue
            else:
                group = step(previous // k, group_uniforms[t])
            stream.append(group * k + bisect_right(tastes[group], symbol_uniforms[t]))
        return np.asarray(stream)

    def _document_tastes(self, rng: np.random.Generator) -> list[list[float]]:
        """A new document's distribution over each group's symbols, as CDFs for bisect."""
        draws = rng.dirichlet(np.full(self.group_size, self.concentration), len(self.transition))
        cdfs = np.cumsum(draws, axis=1)
        cdfs[:, -1] = 1.0  # rounding must never leave a uniform draw past the last symbol
        return cdfs.tolist()

    def bits(self, stream: np.ndarray, context: int | None = None) -> np.ndarray:
        """-log2 P(x_t | past) of every symbol after the burn-in: the ideal loss per token,
        exact and in closed form (the class docstring), given the whole stream before t.

        With ``context`` = L, given only the symbols since the start of t's window instead:
        the symbols after the burn-in cut into windows of L inputs, each predicting the symbol
        after each of its inputs, as the evaluation cuts a split at length L (inputs [jL, jL +
        L), targets one later). The first of them is then context only, so one fewer come
        back. A document's symbols before the window are never seen, so its taste's posterior
        holds only the window's counts: the best loss at evaluation length L.
        """
        k, beta, end = self.group_size, self.concentration, 1 / self.document_length
        separator = symbols = self.separator  # V: the alphabet's symbols are 0 .. V - 1
        first = self.burn_in if context is None else self.burn_in + 1
        t = np.arange(first, len(stream))
        # What t sees of its document starts after the last separator before t (the stream
        # starts with one) ...
        separators = np.flatnonzero(stream == separator)
        seen_from = separators[np.searchsorted(separators, t) - 1] + 1
        if context is not None:  # ... and no earlier than its window's first input
            window_start = self.burn_in + (t - self.burn_in - 1) // context * context
            seen_from = np.maximum(seen_from, window_start)
        same_symbol = _occurrences_between(stream, seen_from, t)
        same_group = _occurrences_between(stream // k, seen_from, t)
        previous, current = stream[t - 1], stream[t]
        after_separator = previous == separator
        # Where x_{t-1} or x_t is a separator the chain's factor is not used: index group 0.
        groups = len(self.transition)
        chain = self.transition[np.where(after_separator, 0, previous // k), current // k % groups]
        posterior = (same_symbol + beta) / (same_group + k * beta)
        probs = np.where(
            current == separator,
            end,
            np.where(after_separator, 1 / symbols, (1 - end) * chain * posterior),
        )
        return -np.log2(probs)


def _occurrences_between(keys: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For each i, how many of ``keys[starts[i]:ends[i]]`` equal ``keys[ends[i]]``."""
    counts = np.empty(len(ends), dtype=np.int64)
    order = np.argsort(keys, kind="stable")  # every key's positions, increasing
    bounds = np.searchsorted(keys[order], np.arange(keys.max() + 2))
    for key in np.unique(keys[ends]):
        positions = order[bounds[key] : bounds[key + 1]]
        mine = np.flatnonzero(keys[ends] == key)
        seen = np.searchsorted(positions, ends[mine]) - np.searchsorted(positions, starts[mine])
        counts[mine] = seen
    return counts


@dataclass(frozen=True)
class SpanMarkovProcess:
    """``long_range=spans``: a sparse Markov chain mixed with spans that repeat earlier ones.

    At a symbol t outside a span, a span starts with probability ``repeat_prob`` (once t has
    ``max(distances)`` symbols behind it): it draws a distance d with P(d) proportional to 1/d
    on ``distances`` = [min, max], and x_t = x_{t-d}. The span goes on to t + 1 with probability
    ``1 - 1 / repeat_length`` (x_{t+1} = x_{t+1-d}, the same d); when it ends, the next symbol
    is again outside a span and may start another. Outside a span, x_t follows the chain.
    Symbols are integers in [0, V); ``ALPHABET`` maps them to bytes.
    """

    transition: np.ndarray  # (V, V) row-stochastic, ``successors`` non-zeros per row
    repeat_prob: float
    repeat_length: float  # mean, >= 1
    distances: tuple[int, int]  # min, max

    @classmethod
    def random(
        cls,
        vocab_size: int,
        successors: int,
        repeat_prob: float,
        repeat_length: float,
        distances: Iterable[int],
        rng: np.random.Generator,
    ) -> SpanMarkovProcess:
        """A process with a random chain (``random_chain``)."""
        low, high = distances
        return cls(
            random_chain(vocab_size, successors, rng), repeat_prob, repeat_length, (low, high)
        )

    @property
    def burn_in(self) -> int:
        """Symbols generated before the first one kept."""
        return _BURN_IN_REACHES * self.distances[1]

    @property
    def distance_probs(self) -> np.ndarray:
        """P(d) for d = min..max: log-uniform, so each octave of distances is as likely."""
        weights = 1.0 / np.arange(self.distances[0], self.distances[1] + 1)
        return weights / weights.sum()

    def sample(self, n_tokens: int, rng: np.random.Generator) -> np.ndarray:
        """``burn_in + n_tokens`` symbols (int64); the first ``burn_in`` are to be discarded.

        All random draws are made up front with numpy (a distance and a length for every symbol
        that would start a span if it were outside one). A span is copied symbol by symbol, so a
        span closer to its source than its own length repeats itself, as the process says.
        """
        n = self.burn_in + n_tokens
        starts = (rng.random(n) < self.repeat_prob).tolist()
        uniforms = rng.random(n).tolist()
        n_starts = sum(starts)
        cdf = np.cumsum(self.distance_probs)
        backs = (self.distances[0] + np.searchsorted(cdf, rng.random(n_starts) * cdf[-1])).tolist()
        lengths = rng.geometric(1 / self.repeat_length, size=n_starts).tolist()
        step = _ChainStep(self.transition)
        stream = [int(rng.integers(len(self.transition)))]
        t, drawn = 1, 0
        while t < n:
            if starts[t]:
                back, length = backs[drawn], min(lengths[drawn], n - t)
                drawn += 1
                if t >= self.distances[1]:
                    for s in range(t, t + length):
                        stream.append(stream[s - back])
                    t += length
                    continue
            stream.append(step(stream[t - 1], uniforms[t]))
            t += 1
        return np.asarray(stream)

    def bits(self, stream: np.ndarray) -> np.ndarray:
        """-log2 P(x_t | x_0..x_{t-1}) of every symbol after the burn-in: the ideal loss per
        token, exact, by the forward recursion over the hidden state (outside a span, or inside
        one from distance d).

        After x_t, P(inside a span from d = max - j | x_0..x_t) is ``scale * span[j]``: index j
        makes the symbols those spans copy, x_{t-max}..x_{t-min}, one slice of the stream, and
        the scale takes the division by P(x_t | past) off the vector (it is folded back in
        before it could overflow). No span starts before t = max, so the recursion starts there,
        outside a span for sure. Each step costs O(max - min) and four vector operations.
        """
        low, high = self.distances
        n = len(stream)
        symbols = np.asarray(stream, dtype=np.uint8)
        vocab = np.arange(len(self.transition), dtype=np.uint8)
        is_symbol = symbols == vocab[:, None]  # (V, n): row v marks where the stream holds v
        markov = self.transition[stream[:-1], stream[1:]]  # (n - 1,) P_chain(x_t | x_{t-1})
        stay, start = 1 - 1 / self.repeat_length, self.repeat_prob
        prior = self.distance_probs[::-1].copy()  # (D,) P(d = max - j)
        span, injected = np.zeros(high - low + 1), np.empty(high - low + 1)  # (D,)
        scale, outside = 1.0, 1.0  # outside: P(outside a span at t | x_0..x_t)
        probs = np.empty(n - self.burn_in)  # the burn-in outlasts max: the loop sees every kept t
        for t in range(high, n):
            # Before x_t: a span at t - 1 goes on, or x_t is outside one and may start one.
            free = outside + (1 - stay) * (1 - outside)
            np.multiply(prior, free * start / (stay * scale), out=injected)
            span += injected
            # Seeing x_t: a span from d survives only where x_{t-d} is x_t.
            span *= is_symbol[symbols[t], t - high : t - low + 1]
            chain = free * (1 - start) * markov[t - 1]
            p = chain + stay * scale * span.sum()
            scale *= stay / p
            outside = chain / p
            if scale > _RESCALE:
                span *= scale
                scale = 1.0
            if t >= self.burn_in:
                probs[t - self.burn_in] = p
        return -np.log2(probs)


@dataclass(frozen=True)
class CopyMarkovProcess:
    """``long_range=lags``: a sparse Markov chain mixed with copies from fixed lags.

    With probability ``copy_prob`` c, x_t copies x_{t-d}, d uniform on ``lags``; otherwise it
    follows the chain, so P(x_t | past) = (1 - c) T[x_{t-1}, x_t] + c mean_d [x_{t-d} == x_t].
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
        """A process with a random chain (``random_chain``)."""
        return cls(random_chain(vocab_size, successors, rng), copy_prob, tuple(lags))

    @property
    def burn_in(self) -> int:
        """Symbols generated before the first one kept."""
        return _BURN_IN_REACHES * max(self.lags)

    def sample(self, n_tokens: int, rng: np.random.Generator) -> np.ndarray:
        """``burn_in + n_tokens`` symbols (int64); the first ``burn_in`` are to be discarded.

        All random draws are made up front with numpy; the loop over Python lists is what the
        sequential dependence leaves, about a microsecond per symbol.
        """
        n = self.burn_in + n_tokens
        copies = (rng.random(n) < self.copy_prob).tolist()
        back = np.asarray(self.lags)[rng.integers(len(self.lags), size=n)].tolist()
        uniforms = rng.random(n).tolist()
        step = _ChainStep(self.transition)
        stream = [int(rng.integers(len(self.transition)))]
        for t in range(1, n):
            if copies[t] and back[t] <= t:
                stream.append(stream[t - back[t]])
            else:
                stream.append(step(stream[t - 1], uniforms[t]))
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
    process = _process(config, np.random.default_rng(process_seed))
    n_train, n_val = (
        min(n, config.max_bytes or n) for n in (config.train_tokens, config.val_tokens)
    )
    train_stream = process.sample(n_train, np.random.default_rng(train_seed))
    val_stream = process.sample(n_val, np.random.default_rng(val_seed))
    alphabet = np.frombuffer(ALPHABET[: config.vocab_size] + SEPARATOR, dtype=np.uint8)
    train.write(alphabet[train_stream[process.burn_in :]])
    val.write(alphabet[val_stream[process.burn_in :]])
    return {"entropy_floor_bits_per_byte": float(process.bits(val_stream).mean())}


def _process(
    config: SyntheticDataConfig, rng: np.random.Generator
) -> DocumentMarkovProcess | SpanMarkovProcess | CopyMarkovProcess:
    """The process ``config.long_range`` names, its chain drawn from ``rng``."""
    shared = (config.vocab_size, config.successors)
    if config.long_range == "documents":
        return DocumentMarkovProcess.random(
            *shared, config.group_size, config.concentration, config.document_length, rng
        )
    if config.long_range == "spans":
        return SpanMarkovProcess.random(
            *shared, config.repeat_prob, config.repeat_length, config.repeat_distances, rng
        )
    return CopyMarkovProcess.random(*shared, config.copy_prob, config.lags, rng)


def _check_synthetic(config: SyntheticDataConfig) -> None:
    if not 2 <= config.vocab_size <= len(ALPHABET):
        raise PosbenchError(
            f"data.vocab_size must be between 2 and {len(ALPHABET)} (got {config.vocab_size})"
        )
    if config.long_range not in LONG_RANGE:
        raise PosbenchError(
            f"data.long_range must be one of {', '.join(LONG_RANGE)} (got {config.long_range!r})"
        )
    chain_states = config.vocab_size
    if config.long_range == "documents":
        _check_documents(config)
        chain_states //= config.group_size
    elif config.long_range == "spans":
        _check_spans(config)
    else:
        _check_lags(config)
    if not 1 <= config.successors <= chain_states:
        raise PosbenchError(
            f"data.successors must be between 1 and the {chain_states} states of the chain "
            f"(got {config.successors})"
        )
    counts = {"train_tokens": config.train_tokens, "val_tokens": config.val_tokens}
    for key, count in counts.items():
        if count <= 0:
            raise PosbenchError(f"data.{key} must be positive (got {count})")


def _check_documents(config: SyntheticDataConfig) -> None:
    if (
        not 1 <= config.group_size <= config.vocab_size // 2
        or config.vocab_size % config.group_size
    ):
        raise PosbenchError(
            f"data.group_size must divide data.vocab_size={config.vocab_size} into at least 2 "
            f"groups (got {config.group_size})"
        )
    if not config.concentration > 0:
        raise PosbenchError(f"data.concentration must be positive (got {config.concentration})")
    if not config.document_length >= 1:
        raise PosbenchError(
            f"data.document_length must be at least 1 (got {config.document_length})"
        )


def _check_spans(config: SyntheticDataConfig) -> None:
    if not 0 <= config.repeat_prob < 1:
        raise PosbenchError(f"data.repeat_prob must be in [0, 1) (got {config.repeat_prob})")
    if not config.repeat_length >= 1:
        raise PosbenchError(f"data.repeat_length must be at least 1 (got {config.repeat_length})")
    distances = config.repeat_distances
    if len(distances) != 2 or not 1 <= distances[0] <= distances[1]:
        raise PosbenchError(
            f"data.repeat_distances must be [min, max] with 1 <= min <= max (got {distances})"
        )


def _check_lags(config: SyntheticDataConfig) -> None:
    if not 0 <= config.copy_prob < 1:
        raise PosbenchError(f"data.copy_prob must be in [0, 1) (got {config.copy_prob})")
    if not config.lags or min(config.lags) <= 0:
        raise PosbenchError(
            f"data.lags must be a non-empty list of positive integers (got {config.lags})"
        )
