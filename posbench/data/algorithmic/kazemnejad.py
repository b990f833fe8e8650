"""What the tasks of Kazemnejad et al. 2023 share ("The Impact of Positional Encoding on Length
Generalization in Transformers", McGill-NLP/length-generalization): their evaluation lengths.

Their dataset builders (scripts/dataset_builders/make_<task>_dataset.py) train on problem
lengths ``train_min..train_max`` and test on every length from ``train_max + 1`` up to twice
``train_max`` (``--test_max``'s default), e.g. the split ``len_tr8_ts16``: trained up to 8,
tested 9..16. A task here is evaluated, by default, at every length of its training range and
of that test range. Their prompts are T5 word tokens in an English template ("Compute 5 3 + 4
? The answer is 5 7."); here each keeps the template's mathematical symbols, one ASCII
character each, and drops its words (each task's docstring gives the mapping). Their decoder
writes the answer after the prompt token by token, and their tasks define no number of
outputs to write at once: the answer is autoregressive (``data.answer_mode``'s default here,
and its only value).
"""

from __future__ import annotations

from dataclasses import dataclass

from posbench.data.algorithmic.base import AlgorithmicDataConfig, AlgorithmicTask
from posbench.data.task import AnswerMode

TEST_LENGTH_FACTOR = 2  # their --test_max defaults to twice --train_max


@dataclass
class KazemnejadDataConfig(AlgorithmicDataConfig):
    """What a task of Kazemnejad et al.'s config holds: answers after the prompt."""

    answer_mode: AnswerMode = AnswerMode.autoregressive


class KazemnejadTask(AlgorithmicTask):
    """A task of Kazemnejad et al.: its answer decoded after the prompt, and evaluated at every
    problem length up to twice the longest trained, as their test splits are."""

    def output_length(self, length: int) -> None:
        return None  # their models decode: no count of outputs written at once

    def default_eval_lengths(self) -> list[int]:
        lo, hi = self.train_lengths
        return list(range(lo, TEST_LENGTH_FACTOR * hi + 1))

    def reference_eval_lengths(self) -> list[int]:
        """Their grid is already every length: the default."""
        return self.default_eval_lengths()
