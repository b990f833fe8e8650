"""``data=missing_duplicate_string`` (context-sensitive): the symbol hidden in a string written
twice.

As Ruoss et al. 2023 define it (google-deepmind/randomized_positional_encodings,
tasks/cs/missing_duplicate_string.py): the problem length n holds a random bit string of
n // 2 bits written twice, where one position (uniform over the 2 * (n // 2)) is replaced by
the placeholder ``?``, then, when n is odd, the empty symbol ``_``; the answer is the hidden
bit. At n = 1, where there is no string to write twice, the prompt and the answer are ``1``,
as the reference sets them.

    01100?10#       the blank's target: 1 (the string is 0110)
    1011?1_#        0 (the string is 101; n = 7)
    01100?10|1      (data.answer_mode=autoregressive)

The reference's symbols are 0, 1, 2 (the placeholder) and 3 (the empty symbol); here they are
``0``, ``1``, ``?`` and ``_``. Its classifier writes its one output from the whole input: here
the one blank after the prompt (by default) or the byte after the separator.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from posbench.data.algorithmic.base import AlgorithmicDataConfig, AlgorithmicTask, digits

MISSING = "?"  # the hidden symbol's place (the reference's 2)
EMPTY = "_"  # the last symbol of an odd length (the reference's 3)


@dataclass
class MissingDuplicateStringDataConfig(AlgorithmicDataConfig):
    name: str = "missing_duplicate_string"
    source: str = "missing_duplicate_string"


class MissingDuplicateString(AlgorithmicTask):
    alphabet = "01" + MISSING + EMPTY
    answer_alphabet = "01"

    def problem(self, length: int, rng: np.random.Generator) -> tuple[str, str]:
        if length == 1:
            return "1", "1"
        half = digits(rng.integers(2, size=length // 2))
        twice = half * 2
        hidden = int(rng.integers(len(twice)))
        prompt = twice[:hidden] + MISSING + twice[hidden + 1 :] + EMPTY * (length % 2)
        return prompt, twice[hidden]

    def output_length(self, length: int) -> int:
        return 1  # the reference's default: one class

    def max_tokens(self, length: int) -> int:
        return length + 2
