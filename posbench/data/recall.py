"""``data=recall``: multi-query associative recall (MQAR, Arora et al. 2023, "Zoology",
https://arxiv.org/abs/2312.04927).

Key-value pairs ``key=V`` (three lowercase letters, one uppercase letter), then every key
queried once more in a random order, each followed by its value:

    xqa=K bto=D ... kfj=R bto=D kfj=R ... xqa=K

The values after the queries are the answers. Keys are distinct within an example; values are
drawn independently. The number of pairs scales with the window: as many as fit twice (pairs
and queries) in the T + 1 bytes, spaces padding the front.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import numpy as np

from posbench.data.task import AnswerSequence, WindowTask, check_positive

KEY_SYMBOLS = np.frombuffer(string.ascii_lowercase.encode(), dtype=np.uint8)
VALUE_SYMBOLS = np.frombuffer(string.ascii_uppercase.encode(), dtype=np.uint8)
KEY_BYTES = 3
PAIR_BYTES = KEY_BYTES + 3  # "key=V "
VALUE_OFFSET = KEY_BYTES + 1  # the value's position inside a pair
PAD = ord(" ")


@dataclass
class RecallDataConfig:
    name: str = "recall"
    source: str = "recall"
    seed: int = 0
    val_examples: int = 64  # evaluation examples per length


def pairs_in(length: int) -> int:
    """How many key-value pairs a window of ``length`` inputs holds."""
    return (length + 1) // (2 * PAIR_BYTES)


class RecallTask(WindowTask):
    def __init__(self, config: RecallDataConfig) -> None:
        check_positive(config, ["val_examples"])
        super().__init__(config)

    def min_length(self) -> int:
        return 2 * PAIR_BYTES - 1  # one pair and its query

    def chance_accuracy(self) -> float:
        return 1 / len(VALUE_SYMBOLS)

    def example(self, length: int, rng: np.random.Generator, depth: float | None) -> AnswerSequence:
        n = pairs_in(length)
        assert n <= len(KEY_SYMBOLS) ** KEY_BYTES, f"{n} pairs need longer keys"
        codes = rng.choice(len(KEY_SYMBOLS) ** KEY_BYTES, size=n, replace=False)  # distinct keys
        digits = codes[:, None] // len(KEY_SYMBOLS) ** np.arange(KEY_BYTES) % len(KEY_SYMBOLS)
        pairs = np.empty((n, PAIR_BYTES), dtype=np.uint8)
        pairs[:, :KEY_BYTES] = KEY_SYMBOLS[digits]  # (n, KEY_BYTES)
        pairs[:, KEY_BYTES] = ord("=")
        pairs[:, VALUE_OFFSET] = rng.choice(VALUE_SYMBOLS, size=n)
        pairs[:, -1] = PAD
        queries = pairs[rng.permutation(n)]
        pad = np.full(length + 1 - 2 * n * PAIR_BYTES, PAD, dtype=np.uint8)
        sequence = np.concatenate([pad, pairs.ravel(), queries.ravel()])
        answer = np.zeros(len(sequence), dtype=bool)
        answer[len(sequence) - n * PAIR_BYTES + VALUE_OFFSET :: PAIR_BYTES] = True
        return sequence, answer
