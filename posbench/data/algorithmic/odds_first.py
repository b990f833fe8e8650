"""``data=odds_first`` (context-sensitive): the prompt's symbols at odd positions, then those at
even positions.

As Ruoss et al. 2023 define it (google-deepmind/randomized_positional_encodings,
tasks/cs/odds_first.py, with experiments/constants.py's binary alphabet): the prompt is n
random bits s_0 ... s_{n-1}, the answer s_1 s_3 s_5 ... then s_0 s_2 s_4 ... (n bits);
the problem length is n.

    00110101|01110100

Positions count from 0, as the reference's code does (``[:, 1::2]`` then ``[:, ::2]``): that
is what its experiments ran. Its docstring counts from 1 and its examples show the other order
(``00110101 -> 0100 0111``, ``110 -> 10 1``); here those prompts give ``01110100`` and ``110``.
As in the reference, n blanks after the prompt take the n answer bits, all written at once (by
default: ``00110101########``); autoregressively, each answer byte follows the ones before
it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from posbench.data.algorithmic.base import AlgorithmicDataConfig, AlgorithmicTask, digits


@dataclass
class OddsFirstDataConfig(AlgorithmicDataConfig):
    name: str = "odds_first"
    source: str = "odds_first"


class OddsFirst(AlgorithmicTask):
    alphabet = "01"
    answer_alphabet = "01"

    def problem(self, length: int, rng: np.random.Generator) -> tuple[str, str]:
        prompt = digits(rng.integers(2, size=length))
        return prompt, prompt[1::2] + prompt[::2]

    def output_length(self, length: int) -> int:
        return length

    def max_tokens(self, length: int) -> int:
        return 2 * length + 1
