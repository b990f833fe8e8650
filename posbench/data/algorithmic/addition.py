"""``data=addition``: the sum of two decimal numbers.

As Kazemnejad et al. 2023 define it (McGill-NLP/length-generalization,
scripts/dataset_builders/make_addition_dataset.py and the ``s2s_addition`` instance
processor): two numbers of ``a`` and ``b`` digits, each uniform over the numbers of that many
digits (no leading zero; a 1-digit number is 0..9), and their sum. The problem length is the
longer operand's digits, ``max(a, b)``, as their plots bin the ``a-by-b`` categories; at
problem length n the digit counts are uniform over the 2n - 1 pairs whose maximum is n, as
in their test split (one operand of n digits, the other of 1..n).

    53726+4971|58697.

Their prompt ``Compute 5 3 7 2 6 + 4 9 7 1 ?`` and target ``The answer is 5 8 6 9 7.`` keep
here their digits, ``+`` and the final ``.``, which ends the answer (a sum has n or n + 1
digits, so its end is not known from the prompt). Their training set draws the two digit
counts uniformly from [1, 8] each (so longer problems are drawn more often: 2n - 1 of the 64
pairs have length n); here ``data.curriculum`` draws the problem length and then the pair.

``data.reversed_digits=true`` writes both operands and the sum least significant digit first
(``62735+1794|79685.``), the format that lets a model add digit by digit in the order the
carries flow; it is posbench's option, not theirs (their builder writes every number most
significant digit first).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from posbench.data.algorithmic.kazemnejad import KazemnejadDataConfig, KazemnejadTask

END = "."  # after the sum's last digit


@dataclass
class AdditionDataConfig(KazemnejadDataConfig):
    name: str = "addition"
    source: str = "addition"
    # their split len_tr8_ts16: operands of 1 to 8 digits in training
    train_lengths: list[int] = field(default_factory=lambda: [1, 8])
    reversed_digits: bool = False  # every number least significant digit first


def random_digits(count: int, rng: np.random.Generator) -> np.ndarray:
    """The digits (int64, most significant first) of a number uniform over those of ``count``
    digits: no leading zero, except that a 1-digit number is 0..9."""
    digits = rng.integers(0, 10, size=count)
    digits[0] = rng.integers(0 if count == 1 else 1, 10)
    return digits


def digit_sum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The digits of a + b (most significant first, no leading zero), from the operands'.

    Vectorised over the digits: a carry leaves column i when the nearest column at or below i
    whose digit sum is not 9 makes one (its sum is 10 or more); a run of 9s passes it on."""
    width = max(len(a), len(b))
    columns = np.zeros(width, dtype=np.int64)  # the digit sums, least significant first
    columns[: len(a)] += a[::-1]
    columns[: len(b)] += b[::-1]
    not_nine = np.where(columns != 9, np.arange(width), -1)
    deciding = np.maximum.accumulate(not_nine)  # the column that decides each carry out
    carry_out = (deciding >= 0) & (columns[deciding] >= 10)
    carry_in = np.concatenate([[False], carry_out[:-1]])
    total = (columns + carry_in) % 10
    if carry_out[-1]:
        total = np.append(total, 1)
    return total[::-1]


def decimal(digits: np.ndarray) -> str:
    """``digits`` (0..9) as their ASCII characters."""
    return (digits + ord("0")).astype(np.uint8).tobytes().decode("ascii")


def operand_digits(length: int, rng: np.random.Generator) -> tuple[int, int]:
    """The two operands' digits at problem length ``length``: uniform over the pairs whose
    maximum is ``length``."""
    pair = rng.integers(2 * length - 1)  # 0..n-1: (n, pair + 1); n..2n-2: (pair - n + 1, n)
    if pair < length:
        return length, int(pair) + 1
    return int(pair) - length + 1, length


class Addition(KazemnejadTask):
    alphabet = "0123456789+"
    answer_alphabet = "0123456789" + END

    def problem(self, length: int, rng: np.random.Generator) -> tuple[str, str]:
        a_digits, b_digits = operand_digits(length, rng)
        a, b = random_digits(a_digits, rng), random_digits(b_digits, rng)
        numbers = a, b, digit_sum(a, b)
        if self.config.reversed_digits:
            numbers = tuple(digits[::-1] for digits in numbers)
        a_text, b_text, total = map(decimal, numbers)
        return f"{a_text}+{b_text}", total + END

    def max_tokens(self, length: int) -> int:
        # n + 1 + n digits and "+", the separator, n + 1 digits and the end
        return 3 * length + 4
