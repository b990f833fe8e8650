"""Tasks: prompts whose answer bytes a model must predict, generated fresh from a seed.

A task is not a corpus: there are no splits to cache. It yields ``Examples``, byte sequences
with a mask of the answer bytes, so that training can learn them and posbench/evaluate.py can
score them; neither the model nor the loop knows which task it is. Two kinds share ``Task``:

* ``WindowTask`` (passkey, copy, recall): an example fills a window, and its length is the
  window's, in tokens: training draws examples of ``train.seq_len`` inputs, evaluation scores
  ``eval.lengths`` windows.
* ``AlgorithmicTask`` (posbench/data/algorithmic/): an example is a problem of a size (its
  *problem length*, e.g. the digits of an addition), padded to the batch's longest; training
  draws each example's size from ``data.train_lengths``, evaluation scores
  ``eval.task_lengths`` sizes.

Either way:

* Training: ``train_batch`` draws new examples from the seeded batch sampler (one draw per
  batch), so batches are reproducible and a resumed run continues the same sequence. Targets
  other than answer bytes are ``IGNORE``: the loss is the answers' only.
* Evaluation: ``examples(length)`` is a fixed set of ``data.val_examples`` examples per length,
  drawn from ``data.seed`` and the length alone, so every run and seed sees the same prompts.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np
import torch

from posbench.errors import PosbenchError

IGNORE = -100  # F.cross_entropy's default ignore_index: targets that are prompt, not answer

# One example: the bytes of a sequence (inputs are all but its last byte, targets all but its
# first) and a mask of the positions that hold answer bytes.
Example = tuple[np.ndarray, np.ndarray]


@dataclass
class Examples:
    """Task examples, stacked (and padded after their end to the longest, unscored)."""

    tokens: torch.Tensor  # uint8 (N, T + 1): inputs tokens[:, :-1], targets tokens[:, 1:]
    answer: torch.Tensor  # bool (N, T): target t is an answer byte (scored), else prompt
    depth_percent: torch.Tensor | None = None  # int64 (N,): the needle's depth, where it has one

    def inputs(self) -> torch.Tensor:
        return self.tokens[:, :-1].long()  # (N, T)

    def targets(self) -> torch.Tensor:
        """Next-byte targets, IGNORE where the byte is not an answer."""
        return self.tokens[:, 1:].long().masked_fill(~self.answer, IGNORE)  # (N, T)

    def window(self) -> int:
        """The inputs of the longest example: the length the model sees."""
        return self.tokens.shape[1] - 1


def stack_examples(examples: Sequence[Example], pad: int = 0) -> Examples:
    """``examples`` stacked, each padded after its end with ``pad`` bytes (not answers) to the
    longest."""
    width = max(len(sequence) for sequence, _ in examples)
    tokens = np.full((len(examples), width), pad, dtype=np.uint8)  # (N, T + 1)
    answer = np.zeros((len(examples), width), dtype=bool)
    for row, (sequence, is_answer) in enumerate(examples):
        tokens[row, : len(sequence)] = sequence
        answer[row, : len(is_answer)] = is_answer
    # The first byte is no target: the mask is of targets tokens[:, 1:].
    return Examples(torch.from_numpy(tokens), torch.from_numpy(answer[:, 1:]))


class Task(ABC):
    """A task source: its config, the examples it trains on, and the ones it is scored on."""

    vocab_size: ClassVar[int] = 256  # a task's prompts are bytes
    # What a task's lengths count: train.seq_len's and eval.lengths' tokens of a window, or
    # the problem length of an algorithmic task.
    length_unit: ClassVar[str] = "tokens"

    def __init__(self, config: Any) -> None:
        self.config = config
        self.name: str = config.name
        self.stats = {"chance_accuracy": self.chance_accuracy()}

    def describe(self) -> str:
        return f"task {self.config.source}, new examples every step"

    @abstractmethod
    def chance_accuracy(self) -> float:
        """The accuracy per answer byte of a model that never looks back at the prompt."""

    def constant_answer_accuracy(self, lengths: Sequence[int]) -> float:
        """The accuracy per answer byte, averaged over ``lengths`` as a run's summary is, of
        one fixed answer: at each answer position, the byte most common there among all the
        problems scored at those lengths (the lowest byte of a tie). A baseline for a model
        that ignores its prompt, the prompt's length too: where answers are skewed (a
        product modulo 5 is 0 more often than not; a sorted answer repeats its neighbour) it
        lies well above chance_accuracy."""
        scored = []  # per length: (answer bytes,) and the answer position of each
        for length in lengths:
            examples = self.examples(length)
            position = examples.answer.cumsum(1) - 1  # (N, T): which answer byte each target is
            scored.append((examples.targets()[examples.answer], position[examples.answer]))
        longest = max(int(position.max()) for _, position in scored) + 1
        counts = torch.zeros(longest, self.vocab_size, dtype=torch.long)
        for targets, position in scored:
            counts.index_put_((position, targets), torch.ones_like(targets), accumulate=True)
        answer = counts.argmax(1)  # (longest,): the fixed answer
        hits = [
            (answer[position] == targets).double().mean().item() for targets, position in scored
        ]
        return sum(hits) / len(hits)

    @abstractmethod
    def check_training(self, seq_len: int) -> None:
        """Raise PosbenchError when training windows of ``seq_len`` inputs cannot hold the
        task's training examples."""

    @abstractmethod
    def train_batch(
        self, batch_size: int, seq_len: int, generator: torch.Generator, step: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``batch_size`` new examples in windows of at most ``seq_len`` inputs at training
        step ``step``: int64 inputs and targets (B, T), the targets IGNORE outside the
        answers. Deterministic from ``generator``'s state and ``step``."""

    @abstractmethod
    def examples(self, length: int) -> Examples:
        """The evaluation examples at ``length``: ``data.val_examples`` of them, from
        ``data.seed`` and ``length`` alone."""

    @abstractmethod
    def validation_examples(self, seq_len: int) -> Examples:
        """The examples validation scores during training at ``seq_len``: fixed, and like the
        training ones."""

    @abstractmethod
    def unscorable(self, length: int) -> str | None:
        """Why ``length`` cannot be evaluated (None: it can)."""


class WindowTask(Task):
    """A task whose example fills a window: its length is the window's, in tokens."""

    # Depths (percent of the window) at which evaluation places the needle, cycling over the
    # examples; empty for tasks without a needle.
    eval_depths: ClassVar[Sequence[int]] = ()

    @abstractmethod
    def min_length(self) -> int:
        """The shortest window that holds one example."""

    @abstractmethod
    def example(self, length: int, rng: np.random.Generator, depth: float | None) -> Example:
        """One example of ``length`` inputs (``length`` + 1 bytes); ``depth`` in [0, 1] places
        the needle (None: at random), for tasks that have one."""

    def check_training(self, seq_len: int) -> None:
        if seq_len < self.min_length():
            raise PosbenchError(
                f"data={self.config.source} needs windows of at least {self.min_length()} "
                f"tokens; raise train.seq_len (got {seq_len})"
            )

    def unscorable(self, length: int) -> str | None:
        if length < self.min_length():
            return f"data={self.config.source} needs windows of at least {self.min_length()} tokens"
        return None

    def batch(
        self, length: int, rng: np.random.Generator, depths: Sequence[float | None]
    ) -> Examples:
        """One example per entry of ``depths``, stacked."""
        assert length >= self.min_length(), f"{length} is too short for {self.name}"
        return stack_examples([self.example(length, rng, d) for d in depths])

    def train_batch(
        self, batch_size: int, seq_len: int, generator: torch.Generator, step: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.check_training(seq_len)
        seed = torch.randint(2**62, (1,), generator=generator).item()
        examples = self.batch(seq_len, np.random.default_rng(seed), [None] * batch_size)
        return examples.inputs(), examples.targets()

    def examples(self, length: int) -> Examples:
        """With ``eval_depths``, example i has its needle at depth
        ``eval_depths[i % len(eval_depths)]``."""
        count = self.config.val_examples
        rng = np.random.default_rng([self.config.seed, length])
        if not self.eval_depths:
            return self.batch(length, rng, [None] * count)
        percents = [self.eval_depths[i % len(self.eval_depths)] for i in range(count)]
        examples = self.batch(length, rng, [p / 100 for p in percents])
        return replace(examples, depth_percent=torch.tensor(percents))

    def validation_examples(self, seq_len: int) -> Examples:
        return self.examples(seq_len)


def check_positive(config: Any, keys: Sequence[str]) -> None:
    """Raise PosbenchError naming the first of ``keys`` of a task config that is not > 0."""
    for key in keys:
        if getattr(config, key) <= 0:
            raise PosbenchError(f"data.{key} must be positive (got {getattr(config, key)})")
