"""``data=sorting``: a list of numbers in increasing order.

As Kazemnejad et al. 2023 define it, in its multi-digit variant (McGill-NLP/length-generalization,
scripts/dataset_builders/make_sort_dataset.py without ``--single_digit``, and the
``s2s_sort_multi_digit`` instance processor; their split ``len_mltd_tr8_ts16``): n numbers,
each uniform over 10..9999, and the same numbers sorted in increasing order (repeats kept);
the problem length is n.

    2468,6863,881,4125|881,2468,4125,6863

Their prompt ``Sort the following list [ 2 4 6 8, 6 8 6 3, ... ].`` and target ``The sorted
list is [ 8 8 1, 2 4 6 8, ... ].`` keep here their digits and commas. This is the variant
of their paper's "Sort (Multi Digit)" results, the one their analyses use (the single-token
variant is commented out of their list of data sets, scripts/experiment_uploaders/util.py);
the single-token variant sorts 50 T5 vocabulary entries by their rank in a list built from
the tokenizer, which only the tokenizer reproduces.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from posbench.data.algorithmic.kazemnejad import KazemnejadDataConfig, KazemnejadTask

LOWEST, HIGHEST = 10, 9999  # their np.random.randint(10, 10000): 2 to 4 digits
COMMA = ","  # between two numbers


@dataclass
class SortingDataConfig(KazemnejadDataConfig):
    name: str = "sorting"
    source: str = "sorting"
    # their split len_mltd_tr8_ts16 trains up to 8 numbers, from their builder's default 4
    train_lengths: list[int] = field(default_factory=lambda: [4, 8])


class Sorting(KazemnejadTask):
    alphabet = "0123456789" + COMMA
    answer_alphabet = "0123456789" + COMMA

    def problem(self, length: int, rng: np.random.Generator) -> tuple[str, str]:
        numbers = rng.integers(LOWEST, HIGHEST + 1, size=length)
        return listed(numbers), listed(np.sort(numbers))

    def max_tokens(self, length: int) -> int:
        # n numbers of up to 4 digits and n - 1 commas, twice, and the separator
        return 2 * (5 * length - 1) + 1


def listed(numbers: np.ndarray) -> str:
    """``numbers`` in decimal, between commas."""
    return COMMA.join(map(str, numbers.tolist()))
