"""Tasks: prompts whose answers a model must write, generated fresh from a seed.

A task is not a corpus: there are no splits to cache. It yields ``Examples``: input bytes, the
target at each input (``IGNORE`` where nothing is trained) and a mask of the targets that are
scored, so that training can learn them and posbench/evaluation/task_accuracy.py can score
them; neither the model nor the loop knows which task it is. An answer is asked for in one of
two ways (``AnswerMode``):

* ``autoregressive``: the prompt, then the answer; each input's target is the next byte, so
  answer byte k is predicted from the bytes before it (scored under teacher forcing, those are
  the true answer bytes 0..k-1).
* ``placeholders`` (algorithmic tasks, Ruoss et al. 2023's protocol): the prompt, then one blank
  input per answer token; the target at blank i is answer token i, so every answer token is
  written at once and none is ever an input.

Two kinds of task share ``Task``:

* ``WindowTask`` (passkey, copy, recall): an example fills a window, and its length is the
  window's, in tokens: training draws examples of ``train.seq_len`` inputs, evaluation scores
  ``eval.lengths`` windows. Their answers are autoregressive.
* ``AlgorithmicTask`` (posbench/data/algorithmic/): an example is a problem of a size (its
  *problem length*, e.g. the digits of an addition), padded to the batch's longest; training
  draws each example's size from ``data.train_lengths``, evaluation scores
  ``eval.task_lengths`` sizes.

Either way:

* Training: ``train_batch`` draws new examples from the seeded batch sampler (one draw per
  batch), so batches are reproducible and a resumed run continues the same sequence. The loss
  is over the trained targets only: never the prompt's.
* Evaluation: ``examples(length)`` is a fixed set of ``data.val_examples`` examples per length,
  drawn from ``data.seed`` and the length alone, so every run and seed sees the same prompts.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, ClassVar

import numpy as np
import torch

from posbench.data.baselines import constant_answer_accuracy
from posbench.errors import PosbenchError

IGNORE = -100  # F.cross_entropy's default ignore_index: targets that are not trained


class AnswerMode(Enum):
    """How a task asks for its answer (the module docstring says what each example holds)."""

    placeholders = "placeholders"
    autoregressive = "autoregressive"


# One example, aligned: its input bytes, the target of each input (IGNORE where nothing is
# trained) and which targets are scored: uint8 (T,), int64 (T,), bool (T,).
Example = tuple[np.ndarray, np.ndarray, np.ndarray]
# An autoregressive example as a task writes it: the bytes of a sequence and which of them
# are answer bytes: uint8 (T + 1,), bool (T + 1,); a task that trains on more bytes than it
# scores (flip_flop, a language model: all of them) adds which are trained, bool (T + 1,).
AnswerSequence = tuple[np.ndarray, np.ndarray] | tuple[np.ndarray, np.ndarray, np.ndarray]


def next_byte_example(
    sequence: np.ndarray, is_answer: np.ndarray, trained: np.ndarray | None = None
) -> Example:
    """The autoregressive ``Example`` of ``sequence``: inputs all its bytes but the last, the
    target of each the next byte, scored where that byte is an answer byte and trained there
    and where ``trained`` (None: nowhere else) says."""
    trained = is_answer if trained is None else trained | is_answer
    targets = np.where(trained[1:], sequence[1:].astype(np.int64), IGNORE)
    return sequence[:-1], targets, is_answer[1:]


@dataclass
class Examples:
    """Task examples, stacked (and padded after their end to the longest, with PAD inputs and
    IGNORE targets)."""

    input_bytes: torch.Tensor  # uint8 (N, T): what the model reads
    target_ids: torch.Tensor  # int64 (N, T): the target of each input, IGNORE where untrained
    answer: torch.Tensor  # bool (N, T): the scored targets, a subset of the trained ones
    depth_percent: torch.Tensor | None = None  # int64 (N,): the needle's depth, where it has one
    p_ignore: torch.Tensor | None = None  # float64 (N,): flip_flop's distribution of each example

    def __post_init__(self) -> None:
        assert not (self.answer & (self.target_ids == IGNORE)).any(), "a scored target is IGNORE"

    def inputs(self) -> torch.Tensor:
        return self.input_bytes.long()  # (N, T)

    def targets(self) -> torch.Tensor:
        """The target of each input, IGNORE where nothing is trained."""
        return self.target_ids  # (N, T)

    def window(self) -> int:
        """The inputs of the longest example: the length the model sees."""
        return self.input_bytes.shape[1]


def stack_examples(examples: Sequence[Example], pad: int = 0) -> Examples:
    """``examples`` stacked, each padded after its end with ``pad`` inputs (IGNORE targets) to
    the longest."""
    width = max(len(inputs) for inputs, _, _ in examples)
    inputs = np.full((len(examples), width), pad, dtype=np.uint8)  # (N, T)
    targets = np.full((len(examples), width), IGNORE, dtype=np.int64)
    scored = np.zeros((len(examples), width), dtype=bool)
    for row, (example_inputs, example_targets, example_scored) in enumerate(examples):
        inputs[row, : len(example_inputs)] = example_inputs
        targets[row, : len(example_targets)] = example_targets
        scored[row, : len(example_scored)] = example_scored
    return Examples(torch.from_numpy(inputs), torch.from_numpy(targets), torch.from_numpy(scored))


class Task(ABC):
    """A task source: its config, the examples it trains on, and the ones it is scored on."""

    vocab_size: ClassVar[int] = 256  # a task's prompts are bytes
    # What a task's lengths count: train.seq_len's and eval.lengths' tokens of a window, or
    # the problem length of an algorithmic task.
    length_unit: ClassVar[str] = "tokens"
    # How the task asks for its answers: a window task writes them after its prompt.
    answer_mode: AnswerMode = AnswerMode.autoregressive
    # The eval.decode the task's paper scores it under, whatever eval.decode says (None: as it
    # says). flip_flop's: teacher_forced, each read scored given the true sequence before it.
    protocol_decode: ClassVar[str | None] = None

    def __init__(self, config: Any) -> None:
        self.config = config
        self.name: str = config.name
        self.stats = {"chance_accuracy": self.chance_accuracy()}

    def describe(self) -> str:
        return f"task {self.config.source}, new examples every step"

    @abstractmethod
    def chance_accuracy(self) -> float:
        """The accuracy per answer token of a uniform guess over the answer's symbols."""

    def constant_answer_accuracy(self, lengths: Sequence[int]) -> float:
        """The accuracy per answer token, averaged over ``lengths`` as a run's summary is, of
        one fixed answer: at each answer index, the token most common there among all the
        problems scored at those lengths (the lowest of a tie). A baseline for a model that
        ignores its prompt, the prompt's length too when ``lengths`` are several: where
        answers are skewed (a product modulo 5 is 0 more often than not; a sorted answer
        repeats its neighbour) it lies well above chance_accuracy. At one length it is the
        best a model can do that reads the length alone (posbench/data/baselines.py)."""
        examples = [self.examples(length) for length in lengths]
        return constant_answer_accuracy([(e.targets(), e.answer) for e in examples])

    @abstractmethod
    def check_training(self, seq_len: int) -> None:
        """Raise PosbenchError when training windows of ``seq_len`` inputs cannot hold the
        task's training examples."""

    @abstractmethod
    def train_batch(
        self, batch_size: int, seq_len: int, generator: torch.Generator, step: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``batch_size`` new examples in windows of at most ``seq_len`` inputs at training
        step ``step``: int64 inputs and targets (B, T), the targets IGNORE where nothing is
        trained. Deterministic from ``generator``'s state and ``step``."""

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
    def example(self, length: int, rng: np.random.Generator, depth: float | None) -> AnswerSequence:
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
        return stack_examples([next_byte_example(*self.example(length, rng, d)) for d in depths])

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
