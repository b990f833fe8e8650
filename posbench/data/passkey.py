"""``data=passkey``: find one pass key hidden in filler text.

The protocol of the landmark-attention and LongRoPE evaluations (Mohtashami & Jaggi 2023,
https://arxiv.org/abs/2305.16300; Ding et al. 2024, https://arxiv.org/abs/2402.13753):
repeated filler sentences, one "The pass key is NNNNN. Remember it. NNNNN is the pass key."
sentence inserted at a depth of the filler, then the question and the digits as answer:

    The grass is green. The sky ...The pass key is 40711. Remember it. 40711 is the pass key.
    ...Here we go. There and back again. What is the pass key? The pass key is 40711

Only the digits after the question are scored. The filler is cut to fill the window exactly,
so the needle's distance to the answer scales with the window; depth 0 puts it first, depth 1
right before the question. Evaluation places it at depths 0, 25, 50, 75 and 100 %.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from posbench.data.haystack import haystack
from posbench.data.task import AnswerSequence, WindowTask, check_positive

QUESTION = "\nWhat is the pass key? The pass key is "


@dataclass
class PasskeyDataConfig:
    name: str = "passkey"
    source: str = "passkey"
    seed: int = 0
    val_examples: int = 100  # evaluation examples per length, spread evenly over the depths
    digits: int = 5  # length of the pass key


def needle(key: str) -> str:
    return f"The pass key is {key}. Remember it. {key} is the pass key. "


class PasskeyTask(WindowTask):
    eval_depths = (0, 25, 50, 75, 100)

    def __init__(self, config: PasskeyDataConfig) -> None:
        check_positive(config, ["val_examples", "digits"])
        super().__init__(config)

    def min_length(self) -> int:
        digits = self.config.digits
        return len(needle("0" * digits)) + len(QUESTION) + digits - 1

    def chance_accuracy(self) -> float:
        return 0.1  # one of ten digits

    def example(self, length: int, rng: np.random.Generator, depth: float | None) -> AnswerSequence:
        key = "".join(str(d) for d in rng.integers(10, size=self.config.digits))
        filler_bytes = length - self.min_length()  # the sequence holds length + 1 bytes
        at = rng.random() if depth is None else depth
        text = haystack(filler_bytes, [needle(key)], [at]) + QUESTION + key
        sequence = np.frombuffer(text.encode(), dtype=np.uint8)
        answer = np.zeros(len(sequence), dtype=bool)
        answer[-len(key) :] = True
        return sequence, answer
