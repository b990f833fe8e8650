"""``data=flip_flop``: flip-flop language modelling (Liu et al. 2023, "Exposing Attention Glitches
with Flip-Flop Language Modeling", https://arxiv.org/abs/2306.00946; its data: the Hugging Face
data set synthseq/flipflop).

A sequence of instruction-bit pairs, one byte each, as the paper's data writes them:

    w1i0i1r1i0w0i1r0r0

``w b`` writes bit b, ``i b`` is ignored, and ``r b`` reads: b is the bit of the latest write,
the only byte that the sequence determines. The first instruction writes and the last reads;
the others are drawn independently, ``i`` with probability ``p_ignore`` and ``w`` and ``r``
with (1 - p_ignore) / 2 each (the paper's FFL(p_i)); the bits of writes and ignores are fair
coins. A window of T inputs holds (T + 1) // 2 pairs, a space padding the front when T is even.

As in the paper, a model learns it as a language: every byte is trained (the random ones
cannot be predicted better than their entropy), and only the read bits are scored, under
teacher forcing (``protocol_decode``): the error rate on the reads is 1 - teacher-forced
accuracy. Training draws from FFL(p_ignore), 0.8 by default; evaluation scores
``data.val_examples`` sequences at each length from each of FFL(p_ignore), the sparse
FFL(p_ignore_sparse) (0.98: long stretches between a write and its read) and the dense
FFL(p_ignore_dense) (0.1), reported apart in ``accuracy_by_p_ignore``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from posbench.data.task import (
    AnswerSequence,
    Examples,
    WindowTask,
    check_positive,
    next_byte_example,
    stack_examples,
)
from posbench.errors import PosbenchError

WRITE, READ, IGNORE_INSTRUCTION = b"w", b"r", b"i"
PAD = ord(" ")


@dataclass
class FlipFlopDataConfig:
    name: str = "flip_flop"
    source: str = "flip_flop"
    seed: int = 0
    val_examples: int = 64  # evaluation sequences per length and distribution
    p_ignore: float = 0.8  # training's (and the in-distribution test's) share of ignores
    p_ignore_sparse: float = 0.98  # the sparse test distribution's
    p_ignore_dense: float = 0.1  # the dense test distribution's


def flip_flop_sequence(pairs: int, p_ignore: float, rng: np.random.Generator) -> np.ndarray:
    """``pairs`` instruction-bit pairs of FFL(p_ignore): uint8 (2 * pairs,)."""
    p_other = (1 - p_ignore) / 2
    codes = rng.choice(3, size=pairs, p=[p_other, p_other, p_ignore])  # 0 w, 1 r, 2 i
    codes[0], codes[-1] = 0, 1
    bits = rng.integers(2, size=pairs)
    writes = np.flatnonzero(codes == 0)
    # Each pair's latest write at or before it (the first pair writes): a read returns its bit.
    latest = writes[np.searchsorted(writes, np.arange(pairs), side="right") - 1]
    bits = np.where(codes == 1, bits[latest], bits)
    instructions = np.frombuffer(WRITE + READ + IGNORE_INSTRUCTION, dtype=np.uint8)[codes]
    return np.stack([instructions, ord("0") + bits], axis=1).ravel().astype(np.uint8)


class FlipFlopTask(WindowTask):
    protocol_decode = "teacher_forced"

    def __init__(self, config: FlipFlopDataConfig) -> None:
        check_positive(config, ["val_examples"])
        for key in ("p_ignore", "p_ignore_sparse", "p_ignore_dense"):
            if not 0 <= getattr(config, key) < 1:
                raise PosbenchError(f"data.{key} must be in [0, 1) (got {getattr(config, key)})")
        super().__init__(config)

    def min_length(self) -> int:
        return 3  # "w0r0"

    def chance_accuracy(self) -> float:
        return 0.5

    def distributions(self) -> tuple[float, ...]:
        """The p_ignore of each test distribution: in-distribution, sparse, dense."""
        return (self.config.p_ignore, self.config.p_ignore_sparse, self.config.p_ignore_dense)

    def example(self, length: int, rng: np.random.Generator, depth: float | None) -> AnswerSequence:
        return self.drawn(length, rng, self.config.p_ignore)

    def drawn(self, length: int, rng: np.random.Generator, p_ignore: float) -> AnswerSequence:
        """A sequence of FFL(p_ignore) in ``length`` inputs: its bytes, the read bits, and the
        bytes trained (all but the padding)."""
        pairs = flip_flop_sequence((length + 1) // 2, p_ignore, rng)
        sequence = np.concatenate([np.full(length + 1 - len(pairs), PAD, np.uint8), pairs])
        read = np.zeros(len(sequence), dtype=bool)
        read[1:] = sequence[:-1] == ord(READ)
        trained = np.ones(len(sequence), dtype=bool)
        trained[: length + 1 - len(pairs)] = False
        return sequence, read, trained

    def examples(self, length: int) -> Examples:
        """``data.val_examples`` sequences of each test distribution, in that order."""
        rng = np.random.default_rng([self.config.seed, length])
        count = self.config.val_examples
        p_ignore = [p for p in self.distributions() for _ in range(count)]
        examples = stack_examples(
            [next_byte_example(*self.drawn(length, rng, p)) for p in p_ignore]
        )
        return replace(examples, p_ignore=torch.tensor(p_ignore, dtype=torch.float64))

    def validation_examples(self, seq_len: int) -> Examples:
        """The in-distribution ones: those like training's."""
        rng = np.random.default_rng([self.config.seed, seq_len])
        return self.batch(seq_len, rng, [None] * self.config.val_examples)
