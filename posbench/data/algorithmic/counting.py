"""``data=counting``: how many symbols the prompt holds, modulo 10.

As Kazemnejad et al. 2023 define it in their modular, multi-symbol variant
(McGill-NLP/length-generalization, scripts/dataset_builders/make_count_dataset.py with
``--count_task_type multi_char --modular``, the data set ``sc_count_mod`` and its
``count_mod`` instance processor; their split ``mc_tr20_ts40``): n symbols, each uniform over
26, and n modulo 10; the problem length is n.

    qazqkvpbfhwx|2

Their prompt ``Count: <n tokens>`` keeps here its n symbols. Their 26 symbols are the first
26 strings of a list built from the T5 tokenizer (single-token characters and vocabulary
entries); which symbols they are does not change any answer, and here they are a..z. They
classify the count with a 10-way head over the whole sequence; here the one answer digit is
predicted after the separator. Not here: their regression variant (``sc_count``, the count
itself scored by squared error) and their single-symbol variant (one of the tokenizer's
symbols repeated n times, a different symbol for every example of a length).
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field

import numpy as np

from posbench.data.algorithmic.kazemnejad import KazemnejadDataConfig, KazemnejadTask

MODULUS = 10  # the answer is the count's last digit, one of their 10 labels
SYMBOLS = string.ascii_lowercase  # their 26 symbols, renamed


@dataclass
class CountingDataConfig(KazemnejadDataConfig):
    name: str = "counting"
    source: str = "counting"
    # their split mc_tr20_ts40 trains up to 20 symbols, from their builder's default 4
    train_lengths: list[int] = field(default_factory=lambda: [4, 20])


class Counting(KazemnejadTask):
    alphabet = SYMBOLS
    answer_alphabet = "0123456789"

    def problem(self, length: int, rng: np.random.Generator) -> tuple[str, str]:
        codes = np.frombuffer(SYMBOLS.encode("ascii"), dtype=np.uint8)
        prompt = codes[rng.integers(len(SYMBOLS), size=length)].tobytes().decode("ascii")
        return prompt, str(length % MODULUS)

    def max_tokens(self, length: int) -> int:
        return length + 2
