"""What the RULER-style tasks share (Hsieh et al. 2024, "RULER: What's the Real Context Size of
Your Long-Context Language Models?", https://arxiv.org/abs/2404.06654; NVIDIA/RULER's
scripts/data/synthetic/): a noise haystack with needles at depths, random words made of
letters, numbers, and a prompt that ends in its answer, filling a window exactly.

RULER sizes its prompts in a pretrained tokenizer's tokens; posbench's are bytes, so here a
length is bytes, a "word" is a few random letters (RULER draws English words from the
wonderwords lists, which posbench does not download) and values have fewer digits.
"""

from __future__ import annotations

import string
from collections.abc import Sequence

import numpy as np

from posbench.data.task import AnswerSequence

# RULER's noise haystack, which passkey's filler is too (posbench/data/passkey.py).
FILLER = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
)
LOWERCASE = np.frombuffer(string.ascii_lowercase.encode(), dtype=np.uint8)
UPPERCASE = np.frombuffer(string.ascii_uppercase.encode(), dtype=np.uint8)
DIGITS = np.frombuffer(string.digits.encode(), dtype=np.uint8)
PAD = " "


def haystack(filler_bytes: int, needles: Sequence[str], depths: Sequence[float]) -> str:
    """``filler_bytes`` bytes of repeated FILLER (cut where they end, mid-sentence too) with
    ``needles[i]`` inserted at fraction ``depths[i]`` in [0, 1] of the filler (0: first, 1:
    last); needles at the same depth keep their order."""
    assert len(needles) == len(depths), "one depth per needle"
    filler = FILLER * (filler_bytes // len(FILLER) + 1)
    offsets = [round(depth * filler_bytes) for depth in depths]
    pieces, start = [], 0
    for i in sorted(range(len(needles)), key=lambda i: (offsets[i], i)):
        pieces += [filler[start : offsets[i]], needles[i]]
        start = offsets[i]
    return "".join([*pieces, filler[start:filler_bytes]])


def distinct_words(
    rng: np.random.Generator, count: int, letters: int, alphabet: np.ndarray = LOWERCASE
) -> list[str]:
    """``count`` distinct random words of ``letters`` symbols of ``alphabet`` each (numbers,
    with DIGITS: leading zeros allowed)."""
    assert count <= len(alphabet) ** letters, f"{count} words need more than {letters} letters"
    codes = rng.choice(len(alphabet) ** letters, size=count, replace=False)
    digits = (
        codes[:, None] // len(alphabet) ** np.arange(letters) % len(alphabet)
    )  # (count, letters)
    return [row.tobytes().decode() for row in alphabet[digits]]


def answered(prompt: str, answer: str, length: int, scored: np.ndarray) -> AnswerSequence:
    """The ``length`` + 1 bytes of ``prompt`` then ``answer``, spaces padding the front, and
    which of them are answer bytes whose symbol is one of ``scored`` (the separators between
    an answer's words are neither trained nor scored: the prompt's format gives them, and
    decoding feeds them in)."""
    text = (prompt + answer).rjust(length + 1, PAD)
    assert len(text) == length + 1, f"{len(text)} bytes do not fit a window of {length}"
    sequence = np.frombuffer(text.encode(), dtype=np.uint8)
    is_answer = np.zeros(len(sequence), dtype=bool)
    tail = sequence[len(sequence) - len(answer) :]
    is_answer[len(sequence) - len(answer) :] = np.isin(tail, scored)
    return sequence, is_answer
