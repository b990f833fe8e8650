"""``data=stack_manipulation`` (deterministic context-free): a stack after a list of actions.

As Ruoss et al. 2023 define it (google-deepmind/randomized_positional_encodings,
tasks/dcf/stack_manipulation.py): the prompt is a stack of random bits, bottom to top, then
random actions PUSH 0, PUSH 1 and POP (``a``, ``b``, ``x``; a POP on the empty stack does
nothing); the answer is the stack the actions leave, top to bottom, then the terminator
``.``. The problem length n is the prompt's: the stack holds a uniform 1 to n - 1 bits and the
actions the rest (at n = 1, one bit and no action).

    0110bxx########     the blanks' targets: 110.0000
    0110bxx|110.        (data.answer_mode=autoregressive)

(0110, push 1: 01101, pop: 0110, pop: 011; read from the top: 110.)

As in the reference (by default), n + 1 blanks after the prompt take the stack, its termination
symbol and zeros up to the last blank, all written at once; the zeros are trained but not
scored. Autoregressively, the answer is the stack and the terminator, each byte after the ones
before it. Either way it is scored as the reference scores, up to the terminator (which tells
how deep the stack is and ends an empty one's answer).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from posbench.data.algorithmic.base import AlgorithmicDataConfig, AlgorithmicTask, spell

ACTIONS = "abx"
PUSH_0, PUSH_1, POP = ACTIONS
BITS = "01"
PUSHED = {PUSH_0: "0", PUSH_1: "1"}
TERMINATOR = "."  # after the stack: where the reference writes its termination symbol


@dataclass
class StackManipulationDataConfig(AlgorithmicDataConfig):
    name: str = "stack_manipulation"
    source: str = "stack_manipulation"


def final_stack(stack: str, actions: str) -> str:
    """The bits of ``stack`` (bottom to top) after ``actions``, top to bottom."""
    bits = list(stack)
    for action in actions:
        if action == POP:
            if bits:
                bits.pop()
        else:
            bits.append(PUSHED[action])
    return "".join(reversed(bits))


class StackManipulation(AlgorithmicTask):
    alphabet = BITS + ACTIONS
    answer_alphabet = BITS + TERMINATOR
    answer_padding = "0"  # the reference pads the stack with zeros after the terminator

    def problem(self, length: int, rng: np.random.Generator) -> tuple[str, str]:
        depth = 1 if length == 1 else int(rng.integers(1, length))  # the stack's bits
        stack = spell(BITS, rng.integers(2, size=depth))
        actions = spell(ACTIONS, rng.integers(len(ACTIONS), size=length - depth))
        return stack + actions, final_stack(stack, actions) + TERMINATOR

    def output_length(self, length: int) -> int:
        return length + 1  # a stack of n bits at most, then the terminator

    def max_tokens(self, length: int) -> int:
        # A stack of one bit pushed onto n - 1 times holds n bits.
        return length + 1 + length + 1
