"""``data=duplicate_string`` (context-sensitive): the prompt string, written twice.

As Ruoss et al. 2023 define it (google-deepmind/randomized_positional_encodings,
tasks/cs/duplicate_string.py, with experiments/constants.py's binary alphabet): the prompt is
n random bits, the answer the same n bits twice, without a separator (2n bits); the problem
length is n.

    101######       the blanks' targets: 101101
    101|101101      (data.answer_mode=autoregressive)

As in the reference, 2n blanks after the prompt take the 2n answer bits, all written at once
(by default); autoregressively, each answer byte follows the ones before it (so the second copy
can also be read off the first: posbench/data/baselines.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from posbench.data.algorithmic.base import AlgorithmicDataConfig, AlgorithmicTask, digits


@dataclass
class DuplicateStringDataConfig(AlgorithmicDataConfig):
    name: str = "duplicate_string"
    source: str = "duplicate_string"


class DuplicateString(AlgorithmicTask):
    alphabet = "01"
    answer_alphabet = "01"

    def problem(self, length: int, rng: np.random.Generator) -> tuple[str, str]:
        prompt = digits(rng.integers(2, size=length))
        return prompt, prompt * 2

    def output_length(self, length: int) -> int:
        return 2 * length  # the reference's duplication 2 times the input length

    def max_tokens(self, length: int) -> int:
        return 3 * length + 1
