"""``data=copy``: repeat a random string after a separator.

A window of T inputs holds ``s | s`` (the sequence is T + 1 bytes, so the last byte of the
second copy is the last target), where ``s`` is ``T // 2`` random lowercase letters; when T is
odd a space pads the front. The second copy is the answer: every one of its bytes needs the
byte exactly ``len(s) + 1`` positions back, a distance that scales with the window.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import numpy as np

from posbench.data.task import AnswerSequence, WindowTask, check_positive

SYMBOLS = np.frombuffer(string.ascii_lowercase.encode(), dtype=np.uint8)
SEPARATOR, PAD = ord("|"), ord(" ")


@dataclass
class CopyDataConfig:
    name: str = "copy"
    source: str = "copy"
    seed: int = 0
    val_examples: int = 64  # evaluation examples per length


class CopyTask(WindowTask):
    def __init__(self, config: CopyDataConfig) -> None:
        check_positive(config, ["val_examples"])
        super().__init__(config)

    def min_length(self) -> int:
        return 2  # "a|a"

    def chance_accuracy(self) -> float:
        return 1 / len(SYMBOLS)

    def example(self, length: int, rng: np.random.Generator, depth: float | None) -> AnswerSequence:
        half = length // 2
        s = rng.choice(SYMBOLS, size=half)
        pad = np.full(length + 1 - (2 * half + 1), PAD, dtype=np.uint8)
        sequence = np.concatenate([pad, s, [SEPARATOR], s]).astype(np.uint8)
        answer = np.zeros(len(sequence), dtype=bool)
        answer[-half:] = True
        return sequence, answer
