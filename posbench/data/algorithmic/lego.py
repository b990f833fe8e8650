"""``data=lego``: the value of one variable in a chain of sign assignments.

As Kazemnejad et al. 2023 define it (McGill-NLP/length-generalization,
scripts/dataset_builders/make_lego_dataset.py, after Zhang et al. 2022's LEGO, and the
``s2s_lego`` instance processor; their split ``len_tr8_ts16``): n distinct variables, the
first n of a random permutation of a..z, each of value -1 or +1 at random; the first clause
gives the first variable's value (``q=-1``), each next one a variable as plus or minus the one
before (``t=-q``: t is -q); the question is one variable from the chain's second half (index
ceil(n/2)..n-1, uniform), the answer its value. The problem length is n, the number of
variables (2..26: the second half of one variable is empty, and there are 26 letters).

    q=-1,t=-q,c=+t,f=-c,r=+f?f|-

Their prompt ``If q = -1, t = - q, .... Then, what is the value of f?`` and target ``The
answer is -1.`` keep here their clauses without spaces; "Then, what is the value of" is
written ``?``, and the answer ``+1`` or ``-1`` is its sign alone, one byte (the ``1`` would be
a byte no model can get wrong). ``data.permute_clauses=true`` shuffles the clauses (their
``--permute_clauses``, the split ``len_tr8_ts16_perm``). Their builder writes one example per
possible question of each chain, so examples of a chain share its clauses; here every example
has a chain of its own.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field

import numpy as np

from posbench.data.algorithmic.kazemnejad import KazemnejadDataConfig, KazemnejadTask
from posbench.errors import PosbenchError

VARIABLES = string.ascii_lowercase  # their ALL_VARS
SIGNS = "-+"  # value -1, value +1
QUESTION = "?"  # between the clauses and the variable asked for


@dataclass
class LegoDataConfig(KazemnejadDataConfig):
    name: str = "lego"
    source: str = "lego"
    # their split len_tr8_ts16: chains of 4 to 8 variables in training
    train_lengths: list[int] = field(default_factory=lambda: [4, 8])
    permute_clauses: bool = False  # the clauses in a random order, not the chain's


def clauses(names: str, values: np.ndarray) -> list[str]:
    """The chain's clauses in order: the first variable's value, then each variable as plus
    or minus the one before (``values``: 0 for -1, 1 for +1)."""
    first = f"{names[0]}={SIGNS[values[0]]}1"
    links = [
        f"{names[i]}={'+' if values[i] == values[i - 1] else '-'}{names[i - 1]}"
        for i in range(1, len(names))
    ]
    return [first, *links]


class Lego(KazemnejadTask):
    alphabet = VARIABLES + "=+-1," + QUESTION
    answer_alphabet = SIGNS
    min_problem_length = 2
    max_problem_length = len(VARIABLES)

    def __init__(self, config: LegoDataConfig) -> None:
        super().__init__(config)
        if config.train_lengths[1] > self.max_problem_length:
            raise PosbenchError(
                f"data=lego has problem lengths up to {self.max_problem_length}, one variable "
                f"per letter; lower data.train_lengths (got {list(config.train_lengths)})"
            )

    def problem(self, length: int, rng: np.random.Generator) -> tuple[str, str]:
        names = "".join(rng.permutation(list(VARIABLES))[:length])
        values = rng.integers(2, size=length)
        asked = int(rng.integers(-(-length // 2), length))  # in the chain's second half
        chain = clauses(names, values)
        if self.config.permute_clauses:
            chain = [chain[i] for i in rng.permutation(length)]
        return f"{','.join(chain)}{QUESTION}{names[asked]}", SIGNS[values[asked]]

    def max_tokens(self, length: int) -> int:
        return 5 * length + 3  # n clauses of 4 bytes, n - 1 commas, "?x", the separator, a sign

    def unscorable(self, length: int) -> str | None:
        if length > self.max_problem_length:
            return f"data=lego has problem lengths up to {self.max_problem_length}"
        return super().unscorable(length)

    def default_eval_lengths(self) -> list[int]:
        return [n for n in super().default_eval_lengths() if n <= self.max_problem_length]
