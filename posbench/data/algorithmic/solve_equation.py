"""``data=solve_equation`` (deterministic context-free): the digit x stands for in an equation
modulo 5.

As Ruoss et al. 2023 define it (google-deepmind/randomized_positional_encodings,
tasks/dcf/solve_equation.py, with experiments/constants.py's modulus 5): a random bracketed
expression of n - 2 symbols with ``+`` and ``-`` (modular_arithmetic_brackets' grammar, without
``*``: the reference does not pass mult), one of its digits replaced by ``x``, then ``=`` and
the expression's value modulo 5; the answer is the replaced digit, the one solution (x appears
once, added or subtracted). The problem length n is the equation's length, 3 or more. The
digit replaced is the first at or after a uniform position of the expression, cyclically, as
in the reference (so a digit after a run of brackets and signs is picked more often).

    ((x-2)+(-4))=1|2

Where posbench differs: the reference's classifier writes its one output from the whole
input, here the one blank after the prompt (``((x-2)+(-4))=1#``, by default) or the byte after
the separator; and lengths 1 and 2 are not defined (the reference gives all-zero inputs
there).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from posbench.data.algorithmic.modular_arithmetic import DIGITS, ModularDataConfig, ModularTask
from posbench.data.algorithmic.modular_arithmetic_brackets import expression, expression_draws

OPERATORS = "+-"
UNKNOWN = "x"


@dataclass
class SolveEquationDataConfig(ModularDataConfig):
    name: str = "solve_equation"
    source: str = "solve_equation"
    train_lengths: list[int] = field(default_factory=lambda: [3, 40])  # from the shortest


def first_digit_from(text: str, start: int) -> int:
    """The index of the first digit of ``text`` at or after ``start``, wrapping around."""
    return next(
        i % len(text) for i in range(start, start + len(text)) if text[i % len(text)].isdigit()
    )


class SolveEquation(ModularTask):
    min_problem_length = 3  # x=d

    @property
    def alphabet(self) -> str:
        return self.residues + OPERATORS + "()" + UNKNOWN + "="

    def problem(self, length: int, rng: np.random.Generator) -> tuple[str, str]:
        text, value = expression(length - 2, self.config.modulus, OPERATORS, expression_draws(rng))
        hidden = first_digit_from(text, int(rng.integers(len(text))))
        equation = f"{text[:hidden]}{UNKNOWN}{text[hidden + 1 :]}={DIGITS[value]}"
        return equation, text[hidden]
