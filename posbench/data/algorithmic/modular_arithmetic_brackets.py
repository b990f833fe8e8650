"""``data=modular_arithmetic_brackets`` (deterministic context-free): a bracketed expression
modulo 5.

As Ruoss et al. 2023 define it (google-deepmind/randomized_positional_encodings,
tasks/dcf/modular_arithmetic_brackets.py, with experiments/constants.py's modulus 5 and
mult=True): the prompt is a random expression of exactly n symbols, the problem length, from
the grammar

    n = 1: d    n = 2: -d    n = 3: (d)    n = 4: (-d)    (d a uniform residue 0..4)
    n >= 5: (L o R), L of a uniform 1..n - 4 symbols, R of the rest, o uniform over + - *

and the answer its value modulo 5, one digit (``data.mult=false`` leaves ``*`` out).

    ((-3)*(2-4))|1

(-3 * -2 = 6 = 1 modulo 5.) The reference's classifier writes its one output from the whole
input: here the one blank after the prompt (``((-3)*(2-4))#``, by default) or the byte after
the separator.
"""

from __future__ import annotations

import operator
import random
from dataclasses import dataclass

import numpy as np

from posbench.data.algorithmic.modular_arithmetic import DIGITS, ModularDataConfig, ModularTask

APPLY = {"+": operator.add, "-": operator.sub, "*": operator.mul}


@dataclass
class ModularArithmeticBracketsDataConfig(ModularDataConfig):
    name: str = "modular_arithmetic_brackets"
    source: str = "modular_arithmetic_brackets"
    mult: bool = True  # whether * is an operator (Ruoss et al.: yes)


def expression(length: int, modulus: int, operators: str, draw: random.Random) -> tuple[str, int]:
    """A random bracketed expression of ``length`` symbols over ``operators`` (some of
    ``+-*``) and its value modulo ``modulus``."""
    if length <= 4:  # d, -d, (d), (-d)
        value = draw.randrange(modulus)
        negated = length % 2 == 0
        text = f"-{value}" if negated else str(value)
        return (f"({text})" if length > 2 else text), (-value if negated else value) % modulus
    left_length = draw.randrange(1, length - 3)
    left, a = expression(left_length, modulus, operators, draw)
    right, b = expression(length - 3 - left_length, modulus, operators, draw)
    symbol = draw.choice(operators)
    return f"({left}{symbol}{right})", APPLY[symbol](a, b) % modulus


def expression_draws(rng: np.random.Generator) -> random.Random:
    """The draws of one expression, seeded from ``rng``: it takes up to ``length`` of them one
    at a time, which Python's generator does several times faster than numpy's."""
    return random.Random(int(rng.integers(2**63)))


class ModularArithmeticBrackets(ModularTask):
    @property
    def operators(self) -> str:
        return "+-*" if self.config.mult else "+-"

    @property
    def alphabet(self) -> str:
        return self.residues + self.operators + "()"

    def problem(self, length: int, rng: np.random.Generator) -> tuple[str, str]:
        text, value = expression(length, self.config.modulus, self.operators, expression_draws(rng))
        return text, DIGITS[value]
