"""``AlgorithmicTask``: a problem of a given size, its prompt and its answer as bytes.

A task implements ``problem(length, rng)`` (the prompt and the answer as strings of its own
symbols), ``output_length(length)`` and ``max_tokens(length)``; this class turns them into
examples in one of two formats, ``data.answer_mode``:

* ``placeholders`` (the default for Ruoss et al.'s tasks, and their protocol:
  google-deepmind/randomized_positional_encodings, experiments/utils.py
  ``make_model_with_empty_targets``): the prompt, then ``output_length(n)`` blanks, the number
  of outputs the reference's encoder writes at once for a problem of size n,

      <prompt>#####        targets at the blanks: the answer, padded after its end

  The target at blank i is answer token i; an answer shorter than the blanks (a sum, a stack:
  the tasks with a terminator) is padded after its terminator with ``answer_padding``, the
  reference's class 0, which training learns as the reference does and scoring leaves out as its
  ``accuracy_mask`` does. No answer token is ever an input, so one forward pass writes them all.
* ``autoregressive`` (the default for Kazemnejad et al.'s tasks, which have no reference output
  length): the prompt, the separator, the answer,

      <prompt>|<answer>

  each answer byte the target of the byte before it.

Either way only the answer's tokens are scored. This class also draws training sizes from
``data.train_lengths`` with ``data.curriculum`` (posbench/data/algorithmic/curriculum.py), and
pads each batch after the examples' ends to its longest (a causal model never sees the padding
before an answer token). Evaluation scores ``data.val_examples`` problems per length, and a
length here is the problem's size as the reference defines it (e.g. the input string's length),
not the window's: ``Examples.window`` says how many inputs the model saw.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch

from posbench.data.algorithmic.curriculum import BatchLengths, Curriculum, draw_lengths
from posbench.data.task import (
    IGNORE,
    AnswerMode,
    Example,
    Examples,
    Task,
    check_positive,
    next_byte_example,
    stack_examples,
)
from posbench.errors import PosbenchError

SEPARATOR = "|"  # between the prompt and the answer: in no task's alphabet
BLANK = "#"  # an answer token's place after the prompt, under placeholders: in no alphabet
PAD = 0  # after an example's end, never trained
MAX_EVAL_LENGTH = 500  # Ruoss et al. evaluate sizes up to 500
EVAL_STEP = 50  # the default evaluation sizes past the training range, every 50
# The random stream of validation's examples: evaluation's are [data.seed, length] with
# length >= 1, so stream 0 is no evaluation length's.
VALIDATION_STREAM = 0


def digits(values: np.ndarray) -> str:
    """One-digit ``values`` (0 to 9) as a string of digits, in one copy: ``[0, 1, 1]`` ->
    ``"011"``."""
    return (values + ord("0")).astype(np.uint8).tobytes().decode("ascii")


@dataclass
class AlgorithmicDataConfig:
    """What every algorithmic task's ``data`` config holds (a task adds its own options)."""

    name: str = ""
    source: str = ""
    seed: int = 0
    val_examples: int = 64  # evaluation examples per problem length
    # [lo, hi]: the problem lengths training draws from (Ruoss et al.: [1, 40])
    train_lengths: list[int] = field(default_factory=lambda: [1, 40])
    # uniform | fixed | regular_increase | reverse_exponential (curriculum.py)
    curriculum: Curriculum = Curriculum.uniform
    curriculum_every: int = 1000  # regular_increase: steps between two increases
    curriculum_increase: int = 1  # regular_increase: the length added at each
    curriculum_tau: float = 0.95  # reverse_exponential: length n drawn with weight tau ** n
    # mixed | same: one length per example, or one per batch (Ruoss et al.'s; curriculum.py)
    batch_lengths: BatchLengths = BatchLengths.mixed
    # placeholders | autoregressive: the answer at blanks after the prompt, written at once
    # (Ruoss et al.'s protocol), or after a separator byte by byte (base.py's docstring)
    answer_mode: AnswerMode = AnswerMode.placeholders


class AlgorithmicTask(Task):
    """A task whose examples are problems of a size: prompt, separator, answer."""

    length_unit = "problem length"
    alphabet: ClassVar[str]  # the prompt's symbols
    answer_alphabet: ClassVar[str]  # the answer's symbols
    min_problem_length: ClassVar[int] = 1  # the smallest size the task defines
    # Under placeholders, what follows an answer that ends before its last blank (the
    # reference's class 0): set by the tasks whose answers end with a terminator.
    answer_padding: ClassVar[str] = ""

    def __init__(self, config: AlgorithmicDataConfig) -> None:
        check_positive(config, ["val_examples", "curriculum_every", "curriculum_increase"])
        if len(config.train_lengths) != 2 or not (
            self.min_problem_length <= config.train_lengths[0] <= config.train_lengths[1]
        ):
            raise PosbenchError(
                f"data.train_lengths must be [lo, hi] with {self.min_problem_length} <= lo <= hi "
                f"for data={config.source} (got {list(config.train_lengths)})"
            )
        if not 0 < config.curriculum_tau:
            raise PosbenchError(
                f"data.curriculum_tau must be positive (got {config.curriculum_tau})"
            )
        placeholders = config.answer_mode is AnswerMode.placeholders
        if placeholders and self.output_length(self.min_problem_length) is None:
            raise PosbenchError(
                f"data={config.source} has no reference output length to give its answers "
                "blanks (its authors decode them after the prompt); set "
                "data.answer_mode=autoregressive"
            )
        super().__init__(config)
        self.answer_mode = config.answer_mode

    @abstractmethod
    def problem(self, length: int, rng: np.random.Generator) -> tuple[str, str]:
        """A random problem of size ``length``: its prompt and its answer, in the task's
        symbols."""

    @abstractmethod
    def output_length(self, length: int) -> int | None:
        """The reference's ``output_length(n)``: the answer tokens its encoder writes at once
        for a problem of size ``length`` (the padding after a terminator included), the
        blanks of a placeholders example. None: the task has none (Kazemnejad et al.'s)."""

    @abstractmethod
    def max_tokens(self, length: int) -> int:
        """The most bytes an autoregressive example of size ``length`` takes: prompt,
        separator and answer."""

    def max_inputs(self, length: int) -> int:
        """The most inputs an example of size ``length`` gives the model: its window."""
        if self.answer_mode is AnswerMode.autoregressive:
            return self.max_tokens(length) - 1  # all bytes but the last
        return length + self.output_length(length)  # a prompt has at most ``length`` symbols

    def chance_accuracy(self) -> float:
        """A uniform guess over the answer's symbols."""
        return 1 / len(self.answer_alphabet)

    def describe(self) -> str:
        lo, hi = self.train_lengths
        return (
            f"task {self.config.source}, problem lengths {lo}..{hi} "
            f"({self.config.curriculum.value}), answers {self.answer_mode.value}, new examples "
            "every step"
        )

    @property
    def train_lengths(self) -> tuple[int, int]:
        lo, hi = self.config.train_lengths
        return lo, hi

    def example(self, length: int, rng: np.random.Generator) -> Example:
        prompt, answer = self.problem(length, rng)
        if self.answer_mode is AnswerMode.placeholders:
            return self.placeholder_example(length, prompt, answer)
        sequence = ascii_bytes(f"{prompt}{SEPARATOR}{answer}")
        is_answer = np.zeros(len(sequence), dtype=bool)
        is_answer[len(sequence) - len(answer) :] = True
        return next_byte_example(sequence, is_answer)

    def placeholder_example(self, length: int, prompt: str, answer: str) -> Example:
        """``prompt`` then ``output_length(length)`` blanks, the target of blank i the answer's
        token i; scored up to the answer's end (its terminator included, as the reference's
        ``accuracy_mask``), the padding after it trained only."""
        blanks = self.output_length(length)
        assert len(prompt) <= length, f"{self.name}: a prompt longer than its problem length"
        assert len(answer) == blanks or (self.answer_padding and len(answer) < blanks), (
            f"{self.name}: an answer of {len(answer)} tokens for {blanks} blanks"
        )
        inputs = ascii_bytes(prompt + BLANK * blanks)
        targets = np.full(len(inputs), IGNORE, dtype=np.int64)
        padded = answer + self.answer_padding * (blanks - len(answer))
        targets[len(prompt) :] = ascii_bytes(padded)
        scored = np.zeros(len(inputs), dtype=bool)
        scored[len(prompt) : len(prompt) + len(answer)] = True
        return inputs, targets, scored

    def batch(self, lengths: np.ndarray, rng: np.random.Generator) -> Examples:
        """One example of each size in ``lengths``, padded to the longest."""
        return stack_examples([self.example(int(n), rng) for n in lengths], PAD)

    def check_training(self, seq_len: int) -> None:
        needed = self.max_inputs(self.train_lengths[1])
        if seq_len < needed:
            raise PosbenchError(
                f"data={self.config.source} at problem length {self.train_lengths[1]} needs "
                f"windows of {needed} tokens; raise train.seq_len to {needed} (got {seq_len}) "
                "or lower data.train_lengths"
            )

    def train_batch(
        self, batch_size: int, seq_len: int, generator: torch.Generator, step: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each example's size from the curriculum at ``step`` (one size for all of them with
        ``data.batch_lengths=same``); the batch is as wide as its longest example (at most
        ``seq_len``), not ``seq_len``."""
        self.check_training(seq_len)
        seed = torch.randint(2**62, (1,), generator=generator).item()
        rng = np.random.default_rng(seed)
        config = self.config
        same = config.batch_lengths is BatchLengths.same
        lengths = draw_lengths(
            config.curriculum,
            self.train_lengths,
            1 if same else batch_size,
            step,
            rng,
            config.curriculum_every,
            config.curriculum_increase,
            config.curriculum_tau,
        )
        examples = self.batch(np.broadcast_to(lengths, batch_size), rng)
        return examples.inputs(), examples.targets()

    def examples(self, length: int) -> Examples:
        """``data.val_examples`` problems of size ``length``."""
        rng = np.random.default_rng([self.config.seed, length])
        return self.batch(np.full(self.config.val_examples, length), rng)

    def validation_examples(self, seq_len: int) -> Examples:
        """``data.val_examples`` problems with sizes spread evenly over the training range,
        from ``data.seed`` alone."""
        lo, hi = self.train_lengths
        lengths = np.linspace(lo, hi, self.config.val_examples).round().astype(np.int64)
        return self.batch(lengths, np.random.default_rng([self.config.seed, VALIDATION_STREAM]))

    def unscorable(self, length: int) -> str | None:
        if length < self.min_problem_length:
            return (
                f"data={self.config.source} defines problem lengths from {self.min_problem_length}"
            )
        return None

    def default_eval_lengths(self) -> list[int]:
        """The training range at up to 8 evenly spaced sizes, then every ``EVAL_STEP`` up to
        ``MAX_EVAL_LENGTH``."""
        hi = self.train_lengths[1]
        beyond = range((hi // EVAL_STEP + 1) * EVAL_STEP, MAX_EVAL_LENGTH + 1, EVAL_STEP)
        return [*self.lengths_inside(), *beyond]

    def reference_eval_lengths(self) -> list[int]:
        """``eval.task_lengths=reference``: Ruoss et al.'s grid, every size from hi + 1 to
        ``MAX_EVAL_LENGTH`` (41-500 for [1, 40]; the reference's example.py averages from
        42, an off-by-one against the paper's 41), after the default's few sizes inside the
        training range, which draw the figure's in-distribution part and cost little (the
        length_generalization summaries average only past the range)."""
        hi = self.train_lengths[1]
        return [*self.lengths_inside(), *range(hi + 1, MAX_EVAL_LENGTH + 1)]

    def lengths_inside(self) -> list[int]:
        """The training range at up to 8 evenly spaced sizes."""
        lo, hi = self.train_lengths
        inside = np.unique(np.linspace(lo, hi, min(8, hi - lo + 1)).round().astype(int))
        return [int(n) for n in inside]


def ascii_bytes(text: str) -> np.ndarray:
    """``text``'s ASCII bytes: uint8 (len(text),)."""
    return np.frombuffer(text.encode("ascii"), dtype=np.uint8)


def spell(alphabet: str, ids: np.ndarray) -> str:
    """The string of ``alphabet[i]`` for each ``i`` in ``ids``, in one lookup (``str`` of each
    numpy integer, joined, takes microseconds a symbol)."""
    return np.frombuffer(alphabet.encode("ascii"), dtype=np.uint8)[ids].tobytes().decode("ascii")
