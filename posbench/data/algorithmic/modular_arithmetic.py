"""``data=modular_arithmetic`` (regular): an expression of residues and ``+ - *``, modulo 5.

As Ruoss et al. 2023 define it (google-deepmind/randomized_positional_encodings,
tasks/regular/modular_arithmetic.py, with experiments/constants.py's modulus 5): the prompt
alternates random residues 0..4 and random operators ``+``, ``-``, ``*`` (each uniform), from a
residue to a residue, with no brackets; the answer is its value modulo 5, one digit, with the
usual precedence (``*`` before ``+`` and ``-``, each left to right). The problem length n is
the expression's length when n is odd; an even n draws expressions of n - 1 symbols, as the
reference's generator does, so lengths 2k - 1 and 2k draw the same problems.

    1+2*3#          the blank's target: 2
    0*1+4*3-2#      0
    1+2*3|2         (data.answer_mode=autoregressive)

Where posbench differs: the reference's classifier writes its one output from the whole input;
here it is the one blank after the prompt (by default) or the byte after the separator. The
reference's vocabulary also holds a blank ``_`` (its evaluator reads it as ``+`` or ``0``)
that its generator never writes; posbench's alphabet leaves it out. Each product is reduced
modulo the modulus as it is formed, where the reference's int32 products could wrap on a long
run of multiplications.

``ModularTask`` is what this task, ``modular_arithmetic_brackets`` and ``solve_equation``
share: ``data.modulus`` (2 to 10, so that a residue is one digit) and a one-digit answer, the
reference's one output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from posbench.data.algorithmic.base import AlgorithmicDataConfig, AlgorithmicTask, spell
from posbench.errors import PosbenchError

DIGITS = "0123456789"  # residue r is DIGITS[r]: one byte each, for moduli up to 10
OPERATORS = "+-*"


@dataclass
class ModularDataConfig(AlgorithmicDataConfig):
    """The options of a task whose answer is a residue."""

    modulus: int = 5  # Ruoss et al.'s (experiments/constants.py)


@dataclass
class ModularArithmeticDataConfig(ModularDataConfig):
    name: str = "modular_arithmetic"
    source: str = "modular_arithmetic"


class ModularTask(AlgorithmicTask):
    """A task over the residues modulo ``data.modulus`` whose answer is one residue."""

    def __init__(self, config: ModularDataConfig) -> None:
        if not 2 <= config.modulus <= len(DIGITS):
            raise PosbenchError(
                f"data.modulus must be between 2 and {len(DIGITS)}, so that each residue is "
                f"one digit (got {config.modulus})"
            )
        super().__init__(config)

    @property
    def residues(self) -> str:
        """The digits of the residues, 0 to modulus - 1."""
        return DIGITS[: self.config.modulus]

    @property
    def answer_alphabet(self) -> str:
        return self.residues

    def output_length(self, length: int) -> int:
        return 1  # the reference's default: one class

    def max_tokens(self, length: int) -> int:
        return length + 2  # at most ``length`` symbols, the separator, one digit


def reduced(numbers: Sequence[int], operators: str, modulus: int) -> int:
    """The value modulo ``modulus`` of ``numbers[0] operators[0] numbers[1] ...``, ``*`` before
    ``+`` and ``-``."""
    total, term = 0, numbers[0]  # the sum of the finished terms, the product being formed
    for operator, number in zip(operators, numbers[1:], strict=True):
        if operator == "*":
            term = term * number % modulus
        else:
            total += term
            term = number if operator == "+" else -number
    return (total + term) % modulus


class ModularArithmetic(ModularTask):
    @property
    def alphabet(self) -> str:
        return self.residues + OPERATORS

    def problem(self, length: int, rng: np.random.Generator) -> tuple[str, str]:
        modulus = self.config.modulus
        count = (length + 1) // 2  # the residues of an expression of length or length - 1 symbols
        ids = np.empty(2 * count - 1, dtype=np.int64)  # residue, operator, ..., residue
        ids[0::2] = rng.integers(modulus, size=count)
        ids[1::2] = modulus + rng.integers(len(OPERATORS), size=count - 1)  # after the residues
        prompt = spell(self.alphabet, ids)
        return prompt, DIGITS[reduced(ids[0::2].tolist(), prompt[1::2], modulus)]
