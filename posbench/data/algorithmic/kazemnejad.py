"""What the tasks of Kazemnejad et al. 2023 share ("The Impact of Positional Encoding on Length
Generalization in Transformers", McGill-NLP/length-generalization): their evaluation lengths.

Their dataset builders (scripts/dataset_builders/make_<task>_dataset.py) train on problem
lengths ``train_min..train_max`` and test on every length from ``train_max + 1`` up to twice
``train_max`` (``--test_max``'s default), e.g. the split ``len_tr8_ts16``: trained up to 8,
tested 9..16. A task here is evaluated, by default, at every length of its training range and
of that test range. Their prompts are T5 word tokens in an English template ("Compute 5 3 + 4
? The answer is 5 7."); here each keeps the template's mathematical symbols, one ASCII
character each, and drops its words (each task's docstring gives the mapping).
"""

from __future__ import annotations

from posbench.data.algorithmic.base import AlgorithmicTask

TEST_LENGTH_FACTOR = 2  # their --test_max defaults to twice --train_max


class KazemnejadTask(AlgorithmicTask):
    """A task of Kazemnejad et al.: evaluated at every problem length up to twice the longest
    trained, as their test splits are."""

    def default_eval_lengths(self) -> list[int]:
        lo, hi = self.train_lengths
        return list(range(lo, TEST_LENGTH_FACTOR * hi + 1))

    def reference_eval_lengths(self) -> list[int]:
        """Their grid is already every length: the default."""
        return self.default_eval_lengths()
