"""``data=bucket_sort`` (context-sensitive): the prompt's symbols in increasing order.

As Ruoss et al. 2023 define it (google-deepmind/randomized_positional_encodings,
tasks/cs/bucket_sort.py, with experiments/constants.py's vocabulary of 5): the prompt is n
random symbols from 0 to 4, each uniform, the answer the same n symbols sorted; the problem
length is n.

    10204112########        the blanks' targets: 00111224
    10204112|00111224       (data.answer_mode=autoregressive)

As in the reference, n blanks after the prompt take the n answer symbols, all written at once
(by default); autoregressively, each answer byte follows the ones before it (and a sorted
answer mostly repeats its previous byte: posbench/data/baselines.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from posbench.data.algorithmic.base import AlgorithmicDataConfig, AlgorithmicTask, digits

VOCAB_SIZE = 5  # Ruoss et al.'s (experiments/constants.py): the symbols 0 to 4


@dataclass
class BucketSortDataConfig(AlgorithmicDataConfig):
    name: str = "bucket_sort"
    source: str = "bucket_sort"


def bucket_sort(symbols: str) -> str:
    """``symbols`` in increasing order."""
    codes = np.frombuffer(symbols.encode("ascii"), dtype=np.uint8)  # one byte per symbol
    return np.sort(codes).tobytes().decode("ascii")


class BucketSort(AlgorithmicTask):
    alphabet = digits(np.arange(VOCAB_SIZE))
    answer_alphabet = alphabet

    def problem(self, length: int, rng: np.random.Generator) -> tuple[str, str]:
        prompt = digits(rng.integers(VOCAB_SIZE, size=length))
        return prompt, bucket_sort(prompt)

    def output_length(self, length: int) -> int:
        return length

    def max_tokens(self, length: int) -> int:
        return 2 * length + 1
