"""``data=niah_single``, ``niah_multikey``, ``niah_multivalue``, ``niah_multiquery``: RULER's
needles in a noise haystack (Hsieh et al. 2024, https://arxiv.org/abs/2404.06654; NVIDIA/RULER's
scripts/data/synthetic/niah.py), one generator with four configs as RULER's.

``data.keys`` random keys each get ``data.values`` needles "A number for KEY is VALUE. " in
the repeated "The grass is green. ..." filler, at random depths; the prompt then asks for
``data.queries`` of the keys and the answer is all their values:

    The grass is green. The sA number for qzk is 4071. ky is blue. ...A number for bim is
    8812. ...There and back again. \nWhat are the numbers for qzk? 4071

single: 1 key, 1 value, 1 query (RULER's niah_single_1: the only digits in the haystack are
the answer's); multikey: 4 keys, 1 value, 1 query (three distractor needles); multivalue: 1
key, 4 values; multiquery: 4 keys, 1 value, 4 queries. The values are listed query by query,
each key's in the order its needles stand; only their digits are scored (the spaces between them are
given). Evaluation puts the first needle of the first key asked for at depths 0, 25, 50, 75
and 100 % of the filler in turn (``accuracy_by_depth``), the others at random.

What differs from RULER's generator, besides haystack.py's bytes, letters and digits: the
needle is shorter ("One of the special magic numbers for KEY is: VALUE." in RULER), RULER
inserts needles between sentences and here they may cut one, RULER's values are 7 digits (distinct
here) and these ``data.digits`` (4), and RULER scores a value found anywhere in the model's output
where here the answer must be written in order, byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from posbench.data.haystack import DIGITS, answered, distinct_words, haystack
from posbench.data.task import AnswerSequence, WindowTask, check_positive
from posbench.errors import PosbenchError

QUESTION = "\nWhat are the numbers for {}? "


@dataclass
class NiahDataConfig:
    name: str = "niah"
    source: str = "niah"
    seed: int = 0
    val_examples: int = 100  # evaluation examples per length, spread evenly over the depths
    keys: int = 1  # keys with needles (RULER's num_needle_k), at least data.queries
    values: int = 1  # needles per key (num_needle_v)
    queries: int = 1  # keys asked for (num_needle_q)
    key_letters: int = 3  # letters of a key
    digits: int = 4  # digits of a value


def needle(key: str, value: str) -> str:
    return f"A number for {key} is {value}. "


class NiahTask(WindowTask):
    eval_depths = (0, 25, 50, 75, 100)

    def __init__(self, config: NiahDataConfig) -> None:
        check_positive(
            config, ["val_examples", "keys", "values", "queries", "key_letters", "digits"]
        )
        if config.queries > config.keys:
            raise PosbenchError(
                f"data.queries ({config.queries}) asks for more keys than data.keys "
                f"({config.keys}) has"
            )
        super().__init__(config)

    def prompt(
        self, keys: list[str], values: list[list[str]], queried: list[int]
    ) -> tuple[list[str], str, str]:
        """The needles (key by key), the question and the answer of ``keys`` with ``values``
        when the keys at ``queried`` are asked for."""
        needles = [
            needle(key, value) for key, row in zip(keys, values, strict=True) for value in row
        ]
        question = QUESTION.format(", ".join(keys[q] for q in queried))
        return needles, question, " ".join(value for q in queried for value in values[q])

    def min_length(self) -> int:
        c = self.config
        keys = ["a" * c.key_letters] * c.keys
        values = [["0" * c.digits] * c.values] * c.keys
        needles, question, answer = self.prompt(keys, values, list(range(c.queries)))
        return len("".join(needles) + question + answer) - 1

    def chance_accuracy(self) -> float:
        return 1 / len(DIGITS)

    def example(self, length: int, rng: np.random.Generator, depth: float | None) -> AnswerSequence:
        c = self.config
        keys = distinct_words(rng, c.keys, c.key_letters)
        queried = rng.permutation(c.keys)[: c.queries].tolist()
        depths = rng.random((c.keys, c.values))  # (keys, values): each needle's
        if depth is not None:
            depths[queried[0]] = np.maximum(depths[queried[0]], depth)
            depths[queried[0], 0] = depth
        # A key's values in the order its needles stand: the answer lists them so.
        depths.sort(axis=1)
        numbers = iter(distinct_words(rng, c.keys * c.values, c.digits, DIGITS))
        values = [[next(numbers) for _ in range(c.values)] for _ in range(c.keys)]
        needles, question, answer = self.prompt(keys, values, queried)
        filler = length - self.min_length()
        text = haystack(filler, needles, depths.ravel().tolist())
        return answered(text + question, answer, length, scored=DIGITS)
