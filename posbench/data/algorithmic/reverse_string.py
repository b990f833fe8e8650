"""``data=reverse_string`` (deterministic context-free): the prompt string, reversed.

As Ruoss et al. 2023 define it (google-deepmind/randomized_positional_encodings,
tasks/dcf/reverse_string.py, with their binary alphabet): the prompt is n random bits, the
answer the same n bits in reverse order; the problem length is n.

    0111####        the blanks' targets: 1110
    0111|1110       (data.answer_mode=autoregressive)

As in the reference, n blanks after the prompt take the n answer bits, all written at once (by
default); autoregressively, each answer byte follows the ones before it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from posbench.data.algorithmic.base import AlgorithmicDataConfig, AlgorithmicTask, spell


@dataclass
class ReverseStringDataConfig(AlgorithmicDataConfig):
    name: str = "reverse_string"
    source: str = "reverse_string"


class ReverseString(AlgorithmicTask):
    alphabet = "01"
    answer_alphabet = "01"

    def problem(self, length: int, rng: np.random.Generator) -> tuple[str, str]:
        prompt = spell(self.alphabet, rng.integers(2, size=length))
        return prompt, prompt[::-1]

    def output_length(self, length: int) -> int:
        return length

    def max_tokens(self, length: int) -> int:
        return 2 * length + 1
