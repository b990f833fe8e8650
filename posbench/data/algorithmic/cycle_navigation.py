"""``data=cycle_navigation`` (regular): where a walk of steps on a cycle of 5 states ends.

As Ruoss et al. 2023 define it (google-deepmind/randomized_positional_encodings,
tasks/regular/cycle_navigation.py): the prompt is n random steps, each left, stay or right
(``-``, ``0``, ``+``; their ids 0, 1, 2 are steps of -1, 0, +1), the answer the state the walk
reaches on a cycle of 5 states starting from state 0, one digit; the problem length is n.

    +-0--#          the blank's target: 3
    +-0--|3         (data.answer_mode=autoregressive)

(1 - 1 + 0 - 1 - 1 = -2, state 3.) The reference's classifier writes its one output from the
whole input: here the one blank after the prompt (by default) or the byte after the
separator.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from posbench.data.algorithmic.base import AlgorithmicDataConfig, AlgorithmicTask, spell

CYCLE_LENGTH = 5  # the reference's, fixed there too
STEPS = "-0+"  # the symbol of step s is STEPS[s + 1]


@dataclass
class CycleNavigationDataConfig(AlgorithmicDataConfig):
    name: str = "cycle_navigation"
    source: str = "cycle_navigation"


def final_state(steps: np.ndarray) -> int:
    """The state a walk of ``steps`` (each -1, 0 or +1) from state 0 ends in."""
    return int(steps.sum() % CYCLE_LENGTH)


class CycleNavigation(AlgorithmicTask):
    alphabet = STEPS
    answer_alphabet = "".join(map(str, range(CYCLE_LENGTH)))

    def problem(self, length: int, rng: np.random.Generator) -> tuple[str, str]:
        steps = rng.integers(-1, 2, size=length)
        return spell(STEPS, steps + 1), str(final_state(steps))

    def output_length(self, length: int) -> int:
        return 1  # the reference's default: one class

    def max_tokens(self, length: int) -> int:
        return length + 2
