"""``data=compute_sqrt`` (context-sensitive): the floor of a binary number's square root.

As Ruoss et al. 2023 define it (google-deepmind/randomized_positional_encodings,
tasks/cs/compute_sqrt.py): the prompt is a number uniform over 1 to 2 ** n - 1, written in n
bits, most significant first (with its high zeros); the answer is the floor of its square root
in ceil(n / 2) bits, most significant first (with its high zeros: the answer's length is the
prompt's to tell, so there is no terminator). The problem length is n.

    100101###       the blanks' targets: 110 (37: the root is 6.08...)
    111##           10 (7: 2.64...)
    100101|110      (data.answer_mode=autoregressive)

The reference's docstring writes the first as ``100101 -> 101``; 6 is ``110``, which is what
its code computes. As in the reference, ceil(n / 2) blanks after the prompt take the root's
bits, all written at once (by default); autoregressively, each answer byte follows the ones
before it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from posbench.data.algorithmic.base import AlgorithmicDataConfig, AlgorithmicTask
from posbench.data.algorithmic.binary_addition import random_number


@dataclass
class ComputeSqrtDataConfig(AlgorithmicDataConfig):
    name: str = "compute_sqrt"
    source: str = "compute_sqrt"


def root_bits(length: int) -> int:
    """The bits of the square root of a number of ``length`` bits."""
    return (length + 1) // 2


def floor_sqrt(bits: str) -> str:
    """The floor of the square root of the big-endian binary number ``bits``, big-endian, in
    ``root_bits(len(bits))`` bits."""
    return format(math.isqrt(int(bits, 2)), "b").zfill(root_bits(len(bits)))


class ComputeSqrt(AlgorithmicTask):
    alphabet = "01"
    answer_alphabet = "01"

    def problem(self, length: int, rng: np.random.Generator) -> tuple[str, str]:
        prompt = format(random_number(length, rng), "b").zfill(length)
        return prompt, floor_sqrt(prompt)

    def output_length(self, length: int) -> int:
        return root_bits(length)  # the reference's ceil(n / 2)

    def max_tokens(self, length: int) -> int:
        return length + 1 + root_bits(length)
