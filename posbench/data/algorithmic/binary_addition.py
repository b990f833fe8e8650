"""``data=binary_addition`` (context-sensitive): the sum of two binary numbers, little-endian.

As Ruoss et al. 2023 define it (google-deepmind/randomized_positional_encodings,
tasks/cs/binary_addition.py): the problem length n is the whole expression's, two numbers and
the operator between them. The first number takes a uniform 1 to n - 2 bits, the operator one
symbol and the second number the rest; each number is uniform over 1 to 2 ** bits - 1, written
least significant bit first with its high zeros (so ``001`` is 4). The answer is the sum,
least significant bit first without high zeros, then the terminator ``.``.

    001+01101######         the blanks' targets: 01011.0 (4 + 22 = 26)
    1001+000001|100101.     (9 + 32 = 41; data.answer_mode=autoregressive)

At n <= 2 there is no room for an operator, and the reference's prompt is one number of n bits
(uniform over 0 to 2 ** n - 2), its answer that number: ``0##`` with targets ``0.``, ``01###``
with ``01.``.

As in the reference (by default), n + 1 blanks after the prompt take the sum, its termination
symbol (the reference's 2, the operator's id; here ``.``) and zeros up to the last blank, all
written at once; the zeros are trained but not scored (the reference's accuracy mask ends at the
termination symbol). Autoregressively, the answer is the sum and the terminator, each byte
after the ones before it, and the zeros are not written. Either way the terminator is scored:
without it the answer's end would go unscored, the sum's length is not the prompt's to tell.

``BinaryOperation`` is what this task and ``binary_multiplication`` share.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from posbench.data.algorithmic.base import AlgorithmicDataConfig, AlgorithmicTask

TERMINATOR = "."  # after the result: where the reference writes its termination symbol


def random_number(bits: int, rng: np.random.Generator) -> int:
    """A number uniform over 1 to 2 ** bits - 1 (of any size: Python's integers)."""
    while True:
        # The top ``bits`` bits of whole random bytes; 0 is drawn again.
        number = int.from_bytes(rng.bytes((bits + 7) // 8), "little") >> (-bits % 8)
        if number:
            return number


def little_endian(number: int, width: int = 1) -> str:
    """``number`` in binary, least significant bit first, with high zeros up to ``width``."""
    return format(number, "b").zfill(width)[::-1]


class BinaryOperation(AlgorithmicTask):
    """Two little-endian binary numbers and an operator in ``length`` symbols; the answer is
    the result, little-endian, then ``TERMINATOR``."""

    operator: ClassVar[str]  # the prompt's symbol between the numbers (the reference's 2)
    answer_alphabet = "01" + TERMINATOR
    answer_padding = "0"  # the reference pads its result with zeros after the terminator

    @staticmethod
    @abstractmethod
    def apply(first: int, second: int) -> int:
        """The operation's result."""

    @abstractmethod
    def short_answer(self, number: int, length: int) -> str:
        """The answer to a problem of ``length`` <= 2: one number, no operator."""

    def answer(self, first: int, second: int) -> str:
        """The answer to ``first`` and ``second``: the result, little-endian, terminated."""
        return little_endian(self.apply(first, second)) + TERMINATOR

    def problem(self, length: int, rng: np.random.Generator) -> tuple[str, str]:
        if length <= 2:
            number = int(rng.integers(2**length - 1))
            return little_endian(number, length), self.short_answer(number, length)
        first_bits = int(rng.integers(1, length - 1))
        second_bits = length - 1 - first_bits  # the operator takes one symbol
        first, second = random_number(first_bits, rng), random_number(second_bits, rng)
        prompt = (
            little_endian(first, first_bits) + self.operator + little_endian(second, second_bits)
        )
        return prompt, self.answer(first, second)


@dataclass
class BinaryAdditionDataConfig(AlgorithmicDataConfig):
    name: str = "binary_addition"
    source: str = "binary_addition"


class BinaryAddition(BinaryOperation):
    operator = "+"
    alphabet = "01" + operator

    @staticmethod
    def apply(first: int, second: int) -> int:
        return first + second

    def short_answer(self, number: int, length: int) -> str:
        return little_endian(number) + TERMINATOR

    def output_length(self, length: int) -> int:
        return length + 1

    def max_tokens(self, length: int) -> int:
        # From 3 symbols on, a sum of k-bit and 1-bit numbers takes k + 1 = n - 1 bits at most;
        # below, the one number's n bits.
        result_bits = length if length <= 2 else length - 1
        return length + 1 + result_bits + 1
