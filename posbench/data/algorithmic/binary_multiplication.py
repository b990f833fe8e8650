"""``data=binary_multiplication`` (context-sensitive): the product of two binary numbers,
little-endian.

As Ruoss et al. 2023 define it (google-deepmind/randomized_positional_encodings,
tasks/cs/binary_multiplication.py): the prompt is drawn as binary_addition's, with ``*`` for
the operator (posbench/data/algorithmic/binary_addition.py); the answer is the product, least
significant bit first without high zeros, then the terminator ``.``.

    001*01101#########          the blanks' targets: 0001101.0 (4 * 22 = 88)
    1001*000001|000001001.      (9 * 32 = 288; data.answer_mode=autoregressive)

At n <= 2 there is no room for an operator: the prompt is one number of n bits and the answer,
as the reference sets it, n - 1 zeros then the terminator (``0#`` with target ``.``, ``10##``
with ``0.``).

As in the reference (by default), n blanks after the prompt take the product, its termination
symbol and zeros up to the last blank, all written at once; the zeros are trained but not
scored. Autoregressively, the answer is the product and the terminator, each byte after the
ones before it, and the zeros are not written.
"""

from __future__ import annotations

from dataclasses import dataclass

from posbench.data.algorithmic.base import AlgorithmicDataConfig
from posbench.data.algorithmic.binary_addition import TERMINATOR, BinaryOperation


@dataclass
class BinaryMultiplicationDataConfig(AlgorithmicDataConfig):
    name: str = "binary_multiplication"
    source: str = "binary_multiplication"


class BinaryMultiplication(BinaryOperation):
    operator = "*"
    alphabet = "01" + operator

    @staticmethod
    def apply(first: int, second: int) -> int:
        return first * second

    def short_answer(self, number: int, length: int) -> str:
        return "0" * (length - 1) + TERMINATOR

    def output_length(self, length: int) -> int:
        return length  # a product of n - 1 bits at most, then the terminator

    def max_tokens(self, length: int) -> int:
        # A product of j-bit and k-bit numbers takes j + k = n - 1 bits at most, but only k when
        # j = 1 (the number 1 is the only 1-bit one): at n = 3 and 4 one number has 1 bit.
        # Below 3, the answer's n - 1 zeros.
        result_bits = length - 2 if length in (3, 4) else length - 1
        return length + 1 + result_bits + 1
