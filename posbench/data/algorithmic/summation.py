"""``data=summation``: the last digit of a sum of digits.

As Kazemnejad et al. 2023 define it (McGill-NLP/length-generalization,
scripts/dataset_builders/make_sum_dataset.py and the ``s2s_sum`` instance processor with
configs/data/s2s_sum.jsonnet's ``modulo_factor: 10``; their split ``len_tr8_ts16``): n
numbers, each uniform over 1..9, and their sum modulo 10; the problem length is n.

    3+3+1+8+6+1+2+1+9+8+1|3

Their prompt ``Compute: 3 + 3 + 1 + ... .`` and target ``The answer is 3 .`` keep here their
digits and ``+`` signs; the answer is one digit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from posbench.data.algorithmic.kazemnejad import KazemnejadDataConfig, KazemnejadTask

MODULUS = 10  # their modulo_factor


@dataclass
class SummationDataConfig(KazemnejadDataConfig):
    name: str = "summation"
    source: str = "summation"
    # their split len_tr8_ts16 trains up to 8 numbers, from their builder's default 4
    train_lengths: list[int] = field(default_factory=lambda: [4, 8])


class Summation(KazemnejadTask):
    alphabet = "123456789+"
    answer_alphabet = "0123456789"

    def problem(self, length: int, rng: np.random.Generator) -> tuple[str, str]:
        terms = rng.integers(1, 10, size=length)
        return "+".join(map(str, terms.tolist())), str(terms.sum() % MODULUS)

    def max_tokens(self, length: int) -> int:
        return 2 * length + 1  # n digits, n - 1 signs, the separator and the answer
