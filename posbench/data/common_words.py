"""``data=common_words``: RULER's common-word extraction (Hsieh et al. 2024,
https://arxiv.org/abs/2404.06654; NVIDIA/RULER's scripts/data/synthetic/common_words_extraction.py).

A list of random words in a random order: ``data.common`` words appear ``data.common_repeats``
times each and as many other words as the window holds ``data.uncommon_repeats`` times each.
The answer is the common words, in the order they first appear:

    kgo dbe kgo wup ... dbe \nWhat are the 3 most common words? kgo dbe wup

Only the words' letters are scored (the spaces between them are given). The list grows with
the window and the common words' count does not, so they stand out less at length, as in
RULER.

What differs from RULER's generator, besides haystack.py's bytes and letters: RULER numbers
the list ("1. word 2. word ...") and these are separated by spaces alone; RULER asks for 10
words repeated 30 times among words repeated 3 times (6 and 1 below 4096 tokens), here 3
words repeated 4 times among words once, to fit a few hundred bytes; RULER shows few-shot
examples first (a model trained on the task needs none); and RULER scores each common word
found anywhere in the output where here they must be listed in order of first appearance.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from posbench.data.haystack import LOWERCASE, answered, distinct_words
from posbench.data.task import AnswerSequence, WindowTask, check_positive
from posbench.errors import PosbenchError

QUESTION = "\nWhat are the {} most common words? "


@dataclass
class CommonWordsDataConfig:
    name: str = "common_words"
    source: str = "common_words"
    seed: int = 0
    val_examples: int = 64  # evaluation examples per length
    common: int = 3  # words asked for (RULER's num_cw)
    common_repeats: int = 4  # occurrences of each (freq_cw)
    uncommon_repeats: int = 1  # occurrences of each other word (freq_ucw)
    word_letters: int = 3  # letters of a word


class CommonWordsTask(WindowTask):
    def __init__(self, config: CommonWordsDataConfig) -> None:
        keys = ["val_examples", "common", "common_repeats", "uncommon_repeats", "word_letters"]
        check_positive(config, keys)
        if config.common_repeats <= config.uncommon_repeats:
            raise PosbenchError(
                f"data.common_repeats ({config.common_repeats}) must exceed "
                f"data.uncommon_repeats ({config.uncommon_repeats})"
            )
        super().__init__(config)

    def fixed_bytes(self) -> int:
        """The bytes of an example but its uncommon words: the common ones, question, answer."""
        c = self.config
        word = c.word_letters + 1  # and a space
        answer = c.common * word - 1
        return c.common * c.common_repeats * word + len(QUESTION.format(c.common)) + answer

    def uncommon_in(self, length: int) -> int:
        """How many uncommon words a window of ``length`` inputs holds."""
        c = self.config
        return (length + 1 - self.fixed_bytes()) // ((c.word_letters + 1) * c.uncommon_repeats)

    def min_length(self) -> int:
        """As many uncommon words as common ones, at the least."""
        c = self.config
        return self.fixed_bytes() + c.common * (c.word_letters + 1) * c.uncommon_repeats - 1

    def chance_accuracy(self) -> float:
        return 1 / len(LOWERCASE)

    def example(self, length: int, rng: np.random.Generator, depth: float | None) -> AnswerSequence:
        c = self.config
        words = distinct_words(rng, c.common + self.uncommon_in(length), c.word_letters)
        common, uncommon = words[: c.common], words[c.common :]
        listed = common * c.common_repeats + uncommon * c.uncommon_repeats
        listed = [listed[i] for i in rng.permutation(len(listed))]
        answer = " ".join(sorted(common, key=listed.index))
        prompt = " ".join(listed) + QUESTION.format(c.common)
        return answered(prompt, answer, length, scored=LOWERCASE)
