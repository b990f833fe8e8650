"""``data=variable_tracking``: RULER's variable tracking (Hsieh et al. 2024,
https://arxiv.org/abs/2404.06654; NVIDIA/RULER's scripts/data/synthetic/variable_tracking.py).

``data.chains`` chains of ``data.hops`` hops each: a first variable is assigned a number, and
each hop assigns the previous variable to a new one,

    VAR QXB = 4071. ...VAR KDE = VAR QXB. ...VAR TMO = VAR KDE. ...

the statements of every chain standing in their order at random depths of the "The grass is
green. ..." filler, the chains interleaved. The prompt then gives the first chain's number and
the answer is its variables, in the chain's order:

    ...There and back again. \nWhich variables are 4071? QXB KDE TMO

Only the variables' letters are scored (the spaces between them are given). Each chain has
its own number; variables are distinct.

What differs from RULER's generator, besides haystack.py's bytes, letters and digits: RULER's
variables are 5 letters and these ``data.var_letters`` (3), its numbers 5 digits and these
``data.digits`` (4), its statements stand between filler sentences and here they may cut one,
and RULER scores each variable found anywhere in the output where here the answer must list
them in the chain's order. RULER's defaults are 1 chain of 4 hops, as here.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from posbench.data.haystack import DIGITS, UPPERCASE, answered, distinct_words, haystack
from posbench.data.task import AnswerSequence, WindowTask, check_positive

QUESTION = "\nWhich variables are {}? "


@dataclass
class VariableTrackingDataConfig:
    name: str = "variable_tracking"
    source: str = "variable_tracking"
    seed: int = 0
    val_examples: int = 64  # evaluation examples per length
    chains: int = 1  # chains of assignments (RULER's num_chains); the first is asked for
    hops: int = 4  # assignments after a chain's first (num_hops)
    var_letters: int = 3  # letters of a variable's name
    digits: int = 4  # digits of a chain's number


def statements(names: list[str], value: str) -> list[str]:
    """One chain: ``names[0]`` is ``value``, then each name is the one before it."""
    first = f"VAR {names[0]} = {value}. "
    return [first, *(f"VAR {b} = VAR {a}. " for a, b in pairwise(names))]


class VariableTrackingTask(WindowTask):
    def __init__(self, config: VariableTrackingDataConfig) -> None:
        check_positive(config, ["val_examples", "chains", "hops", "var_letters", "digits"])
        super().__init__(config)

    def prompt(self, chains: list[list[str]], values: list[str]) -> tuple[list[str], str, str]:
        """The statements (chain by chain), the question and the answer of ``chains`` of
        variables with ``values``: the first chain is asked for."""
        needles = [s for chain, v in zip(chains, values, strict=True) for s in statements(chain, v)]
        return needles, QUESTION.format(values[0]), " ".join(chains[0])

    def min_length(self) -> int:
        c = self.config
        chains = [["A" * c.var_letters] * (c.hops + 1)] * c.chains
        needles, question, answer = self.prompt(chains, ["0" * c.digits] * c.chains)
        return len("".join(needles) + question + answer) - 1

    def chance_accuracy(self) -> float:
        return 1 / len(UPPERCASE)

    def example(self, length: int, rng: np.random.Generator, depth: float | None) -> AnswerSequence:
        c = self.config
        names = iter(distinct_words(rng, c.chains * (c.hops + 1), c.var_letters, UPPERCASE))
        chains = [[next(names) for _ in range(c.hops + 1)] for _ in range(c.chains)]
        needles, question, answer = self.prompt(
            chains, distinct_words(rng, c.chains, c.digits, DIGITS)
        )
        # Each chain's statements at sorted depths, so that they stand in the chain's order.
        depths = np.sort(rng.random((c.chains, c.hops + 1)), axis=1).ravel().tolist()
        text = haystack(length - self.min_length(), needles, depths)
        return answered(text + question, answer, length, scored=UPPERCASE)
