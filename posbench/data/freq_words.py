"""``data=freq_words``: RULER's frequent-word extraction (Hsieh et al. 2024,
https://arxiv.org/abs/2404.06654; NVIDIA/RULER's scripts/data/synthetic/freq_words_extraction.py).

Random "coded" words drawn from a Zipf law: the word of rank k appears floor(m k^-alpha) times
(``data.alpha``, 2 as in RULER), m as large as the window holds, in a random order. The word
of rank 1 is noise, dots ("..."); the answer is the words of ranks 2, 3 and 4, most frequent
first:

    ... kgo ... dbe ... ... kgo wup ... \nWhat are the 3 most frequent words? kgo dbe wup

Only the words' letters are scored (the spaces between them are given). A window must hold
enough words that ranks 2 to 5 have distinct counts (the answer and its order are then
unambiguous).

What differs from RULER's generator, besides haystack.py's bytes and letters: RULER's coded
words have 6 letters and these ``data.word_letters`` (3); RULER scales the counts by
1 / zeta(alpha) and a vocabulary of a fiftieth of the length, and here the top count m is
whatever fills the window (the same law: the rarest ranks round to no occurrence); RULER tells
the model to ignore the dots, and here training teaches it; and RULER scores each word found
anywhere in the output where here they must be listed in order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from itertools import pairwise

import numpy as np

from posbench.data.haystack import LOWERCASE, answered, distinct_words
from posbench.data.task import AnswerSequence, WindowTask, check_positive
from posbench.errors import PosbenchError

ANSWER_WORDS = 3  # ranks 2, 3, 4: RULER's "three most frequent"
QUESTION = f"\nWhat are the {ANSWER_WORDS} most frequent words? "


@dataclass
class FreqWordsDataConfig:
    name: str = "freq_words"
    source: str = "freq_words"
    seed: int = 0
    val_examples: int = 64  # evaluation examples per length
    alpha: float = 2.0  # the Zipf exponent
    word_letters: int = 3  # letters of a coded word


@cache
def zipf_counts(top: int, alpha: float) -> np.ndarray:
    """floor(top * k^-alpha) for ranks k = 1, 2, ... while it is positive: int64 (K,)."""
    ranks = np.arange(1, int(top ** (1 / alpha)) + 2)
    counts = np.floor(top * ranks.astype(float) ** -alpha).astype(np.int64)
    return counts[counts > 0]


def separated(top: int, alpha: float) -> bool:
    """Whether ranks 2 to 5 have distinct counts at top count ``top``."""
    counts = [int(top * k**-alpha) for k in range(2, ANSWER_WORDS + 3)]
    return counts[-2] > 0 and all(a > b for a, b in pairwise(counts))


class FreqWordsTask(WindowTask):
    def __init__(self, config: FreqWordsDataConfig) -> None:
        check_positive(config, ["val_examples", "word_letters"])
        if config.alpha <= 1:
            raise PosbenchError(f"data.alpha must exceed 1, as a Zipf law's (got {config.alpha})")
        super().__init__(config)
        # Counts x > y + 1 floor apart: from this top count on, every one separates ranks 2-5.
        k = ANSWER_WORDS + 1
        always = math.ceil(1 / (k**-config.alpha - (k + 1) ** -config.alpha))
        self.min_top = next(top for top in range(1, always + 1) if separated(top, config.alpha))

    def length_of(self, top: int) -> int:
        """The window that the words of top count ``top``, the question and answer fill."""
        word = self.config.word_letters + 1  # and a space
        answer = ANSWER_WORDS * word - 1
        return int(zipf_counts(top, self.config.alpha).sum()) * word + len(QUESTION) + answer - 1

    def top_count(self, length: int) -> int:
        """The largest top count whose words fill at most ``length`` inputs and separate ranks
        2 to 5 (at least ``min_length``)."""
        low, high = self.min_top, max(self.min_top, length)  # length_of(top) >= top
        while low < high:  # the largest top that fits, by bisection: length_of only grows
            middle = (low + high + 1) // 2
            low, high = (middle, high) if self.length_of(middle) <= length else (low, middle - 1)
        return next(t for t in range(low, 0, -1) if separated(t, self.config.alpha))

    def min_length(self) -> int:
        return self.length_of(self.min_top)

    def chance_accuracy(self) -> float:
        return 1 / len(LOWERCASE)

    def example(self, length: int, rng: np.random.Generator, depth: float | None) -> AnswerSequence:
        c = self.config
        counts = zipf_counts(self.top_count(length), c.alpha)
        words = ["." * c.word_letters, *distinct_words(rng, len(counts) - 1, c.word_letters)]
        listed = np.repeat(np.array(words), counts)
        prompt = " ".join(listed[rng.permutation(len(listed))]) + QUESTION
        answer = " ".join(words[1 : ANSWER_WORDS + 1])
        return answered(prompt, answer, length, scored=LOWERCASE)
