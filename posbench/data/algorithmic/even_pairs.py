"""``data=even_pairs`` (regular): is the number of unequal neighbours (01 or 10) odd?

As Ruoss et al. 2023 define it (google-deepmind/randomized_positional_encodings,
tasks/regular/even_pairs.py): the prompt is n random bits, the answer one bit, 1 when the
pairs of neighbouring bits that differ (``01`` and ``10``) are odd in number; the problem
length is n.

    0101001#        the blank's target: 1
    0101001|1       (data.answer_mode=autoregressive)

(three ``01`` and two ``10``.) The count is odd exactly when the first and the last bit
differ, which a model can find without counting. The reference's classifier writes its one
output from the whole input: here the one blank after the prompt (by default) or the byte
after the separator.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from posbench.data.algorithmic.base import AlgorithmicDataConfig, AlgorithmicTask, spell


@dataclass
class EvenPairsDataConfig(AlgorithmicDataConfig):
    name: str = "even_pairs"
    source: str = "even_pairs"


def odd_unequal_pairs(bits: np.ndarray) -> int:
    """1 when an odd number of neighbours in ``bits`` differ, else 0."""
    return int(np.count_nonzero(bits[1:] != bits[:-1]) % 2)


class EvenPairs(AlgorithmicTask):
    alphabet = "01"
    answer_alphabet = "01"

    def problem(self, length: int, rng: np.random.Generator) -> tuple[str, str]:
        bits = rng.integers(2, size=length)
        return spell(self.alphabet, bits), str(odd_unequal_pairs(bits))

    def output_length(self, length: int) -> int:
        return 1  # the reference's default: one class

    def max_tokens(self, length: int) -> int:
        return length + 2
