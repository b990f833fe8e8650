"""``data=parity_check`` (regular): is the number of 1s in a binary string odd?

As Ruoss et al. 2023 define it (google-deepmind/randomized_positional_encodings,
tasks/regular/parity_check.py): the prompt is n random bits, the answer one bit, 1 when the
prompt holds an odd number of 1s; the problem length is n.

    0110100#        the blank's target: 1
    0110100|1       (data.answer_mode=autoregressive)

The reference's classifier writes its one output from the whole input: here the one blank after
the prompt (by default) or the byte after the separator.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from posbench.data.algorithmic.base import AlgorithmicDataConfig, AlgorithmicTask, spell


@dataclass
class ParityCheckDataConfig(AlgorithmicDataConfig):
    name: str = "parity_check"
    source: str = "parity_check"


class ParityCheck(AlgorithmicTask):
    alphabet = "01"
    answer_alphabet = "01"

    def problem(self, length: int, rng: np.random.Generator) -> tuple[str, str]:
        bits = rng.integers(2, size=length)
        return spell(self.alphabet, bits), str(bits.sum() % 2)

    def output_length(self, length: int) -> int:
        return 1  # the reference's default: one class

    def max_tokens(self, length: int) -> int:
        return length + 2
