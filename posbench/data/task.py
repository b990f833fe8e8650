"""Tasks: prompts whose answer bytes a model must predict, generated fresh from a seed.

A task is not a corpus: there are no splits to cache. It yields ``Examples``, byte sequences
with a mask of the answer bytes, so that training can learn them and posbench/evaluate.py can
score them; neither the model nor the loop knows which task it is.

* Training: ``train_batch`` draws new examples at ``train.seq_len`` from the seeded batch
  sampler (one draw per batch), so batches are reproducible and a resumed run continues the
  same sequence. Targets other than answer bytes are ``IGNORE``: the loss is the answers' only.
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

# One example: the bytes of a sequence of length + 1 (inputs are its first ``length`` bytes,
# targets its last ``length``) and a mask of the positions that hold answer bytes.
Example = tuple[np.ndarray, np.ndarray]


@dataclass
class Examples:
    """Task examples of one length, stacked."""

    tokens: torch.Tensor  # uint8 (N, T + 1): inputs tokens[:, :-1], targets tokens[:, 1:]
    answer: torch.Tensor  # bool (N, T): target t is an answer byte (scored), else prompt
    depth_percent: torch.Tensor | None = None  # int64 (N,): the needle's depth, where it has one

    def inputs(self) -> torch.Tensor:
        return self.tokens[:, :-1].long()  # (N, T)

    def targets(self) -> torch.Tensor:
        """Next-byte targets, IGNORE where the byte is not an answer."""
        return self.tokens[:, 1:].long().masked_fill(~self.answer, IGNORE)  # (N, T)


class Task(ABC):
    """A task source: its config, how one example is built, and the examples built from it."""

    # Depths (percent of the window) at which evaluation places the needle, cycling over the
    # examples; empty for tasks without a needle.
    eval_depths: ClassVar[Sequence[int]] = ()
    vocab_size: ClassVar[int] = 256  # a task's prompts are bytes

    def __init__(self, config: Any) -> None:
        self.config = config
        self.name: str = config.name
        self.stats = {"chance_accuracy": self.chance_accuracy()}

    def describe(self) -> str:
        return f"task {self.config.source}, new examples every step"

    @abstractmethod
    def min_length(self) -> int:
        """The shortest window that holds one example."""

    @abstractmethod
    def chance_accuracy(self) -> float:
        """The accuracy per answer byte of a model that never looks back at the prompt."""

    @abstractmethod
    def example(self, length: int, rng: np.random.Generator, depth: float | None) -> Example:
        """One example of ``length`` inputs; ``depth`` in [0, 1] places the needle (None:
        at random), for tasks that have one."""

    def check_length(self, length: int, key: str) -> None:
        if length < self.min_length():
            raise PosbenchError(
                f"data={self.config.source} needs windows of at least {self.min_length()} "
                f"tokens; raise {key} (got {length})"
            )

    def batch(
        self, length: int, rng: np.random.Generator, depths: Sequence[float | None]
    ) -> Examples:
        """One example per entry of ``depths``, stacked."""
        assert length >= self.min_length(), f"{length} is too short for {self.name}"
        sequences, answers = zip(*(self.example(length, rng, d) for d in depths), strict=True)
        tokens = torch.from_numpy(np.stack(sequences))  # (N, T + 1)
        answer = torch.from_numpy(np.stack(answers))[:, 1:]  # (N, T): the first byte is no target
        return Examples(tokens, answer)

    def train_batch(
        self, batch_size: int, seq_len: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``batch_size`` new examples of ``seq_len`` inputs: int64 inputs and targets (B, T),
        the targets IGNORE outside the answers. Deterministic from ``generator``'s state."""
        self.check_length(seq_len, "train.seq_len")
        seed = torch.randint(2**62, (1,), generator=generator).item()
        examples = self.batch(seq_len, np.random.default_rng(seed), [None] * batch_size)
        return examples.inputs(), examples.targets()

    def examples(self, length: int) -> Examples:
        """The evaluation examples at ``length``: ``data.val_examples`` of them, from
        ``data.seed`` and ``length`` alone; with ``eval_depths``, example i has its needle at
        depth ``eval_depths[i % len(eval_depths)]``."""
        count = self.config.val_examples
        rng = np.random.default_rng([self.config.seed, length])
        if not self.eval_depths:
            return self.batch(length, rng, [None] * count)
        percents = [self.eval_depths[i % len(self.eval_depths)] for i in range(count)]
        examples = self.batch(length, rng, [p / 100 for p in percents])
        return replace(examples, depth_percent=torch.tensor(percents))


def check_positive(config: Any, keys: Sequence[str]) -> None:
    """Raise PosbenchError naming the first of ``keys`` of a task config that is not > 0."""
    for key in keys:
        if getattr(config, key) <= 0:
            raise PosbenchError(f"data.{key} must be positive (got {getattr(config, key)})")
