"""Which problem lengths training draws: the curricula of Ruoss et al. 2023
(google-deepmind/randomized_positional_encodings, experiments/curriculum.py) over
``data.train_lengths = [lo, hi]``.

* ``uniform``: every length in [lo, hi] alike (their protocol, and the default).
* ``fixed``: always hi.
* ``regular_increase``: the longest length drawn starts at lo and grows by
  ``data.curriculum_increase`` every ``data.curriculum_every`` steps, up to hi; each example's
  length is uniform up to it (their ``sample_all_length=True``).
* ``reverse_exponential``: length n with probability proportional to
  ``data.curriculum_tau`` ** n (tau < 1 favours short problems).

``data.batch_lengths`` (``BatchLengths``) says how a batch uses them: ``mixed`` (the default)
draws one length per example, so a batch mixes sizes (padded to its longest; the padding is
not scored); ``same`` draws one length per batch, as theirs does (training.py samples one
``length`` a step).
"""

from __future__ import annotations

from enum import Enum

import numpy as np


class Curriculum(Enum):
    uniform = "uniform"
    fixed = "fixed"
    regular_increase = "regular_increase"
    reverse_exponential = "reverse_exponential"


class BatchLengths(Enum):
    mixed = "mixed"  # each example its own length
    same = "same"  # one length for the whole (global) batch, as Ruoss et al. train


def draw_lengths(
    curriculum: Curriculum,
    lengths: tuple[int, int],
    count: int,
    step: int,
    rng: np.random.Generator,
    every: int = 1000,
    increase: int = 1,
    tau: float = 0.95,
) -> np.ndarray:
    """``count`` problem lengths (int64) from ``lengths = (lo, hi)`` at training ``step``."""
    lo, hi = lengths
    if curriculum is Curriculum.uniform:
        return rng.integers(lo, hi + 1, size=count)
    if curriculum is Curriculum.fixed:
        return np.full(count, hi, dtype=np.int64)
    if curriculum is Curriculum.regular_increase:
        longest = min(hi, lo + increase * (step // every))
        return rng.integers(lo, longest + 1, size=count)
    sizes = np.arange(lo, hi + 1)
    # Relative to lo, so that long ranges do not underflow to all-zero weights.
    weights = tau ** (sizes - lo).astype(np.float64)
    return rng.choice(sizes, size=count, p=weights / weights.sum())
