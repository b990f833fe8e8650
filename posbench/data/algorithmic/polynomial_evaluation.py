"""``data=polynomial_evaluation``: a polynomial's value at a point, modulo 10.

As Kazemnejad et al. 2023 define it (McGill-NLP/length-generalization,
scripts/dataset_builders/make_poly_dataset.py and the ``s2s_poly`` instance processor with
configs/data/s2s_poly.jsonnet's ``modulo_factor: 10``; their split ``n_terms_tr8_ts16``): n
terms ``c * x ** d``, each coefficient c uniform over -3..3 and each degree d over 0..3, one
point x uniform over -2..2, and the sum of the terms at x modulo 10 (0..9, as Python's ``%``
gives it for negative sums; ``0 ** 0`` is 1); the problem length is n, the number of terms.

    x=1;-2*x^2+-1*x^0+-3*x^3+-1*x^1+-3*x^0+-3*x^2|7

Their prompt ``Evaluate at x = 1 in - 2 * x ** 2 + - 1 * x ** 0 + ... ?`` and target ``The
answer is 7.`` keep here their numbers (a negative one with its ``-``), ``x``, ``=``, ``*``
and ``+``; ``**`` is written ``^`` and their word "in" between the point and the polynomial
``;``. The answer is one digit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from posbench.data.algorithmic.kazemnejad import KazemnejadDataConfig, KazemnejadTask

MODULUS = 10  # their modulo_factor
COEFFICIENTS = (-3, 3)  # the range of a term's coefficient
DEGREES = (0, 3)  # of a term's degree
POINTS = (-2, 2)  # of x


@dataclass
class PolynomialEvaluationDataConfig(KazemnejadDataConfig):
    name: str = "polynomial_evaluation"
    source: str = "polynomial_evaluation"
    # their split n_terms_tr8_ts16 trains up to 8 terms, from their builder's default 4
    train_lengths: list[int] = field(default_factory=lambda: [4, 8])


def value_modulo(coefficients: np.ndarray, degrees: np.ndarray, x: int) -> int:
    """The polynomial's value at ``x`` modulo ``MODULUS``, in 0..MODULUS - 1."""
    return int((coefficients * x**degrees).sum()) % MODULUS


class PolynomialEvaluation(KazemnejadTask):
    alphabet = "0123-+*^x=;"
    answer_alphabet = "0123456789"

    def problem(self, length: int, rng: np.random.Generator) -> tuple[str, str]:
        coefficients = rng.integers(COEFFICIENTS[0], COEFFICIENTS[1] + 1, size=length)
        degrees = rng.integers(DEGREES[0], DEGREES[1] + 1, size=length)
        x = int(rng.integers(POINTS[0], POINTS[1] + 1))
        terms = "+".join(
            f"{c}*x^{d}" for c, d in zip(coefficients.tolist(), degrees.tolist(), strict=True)
        )
        return f"x={x};{terms}", str(value_modulo(coefficients, degrees, x))

    def max_tokens(self, length: int) -> int:
        # "x=-2;", n terms of up to 6 bytes ("-3*x^2") and n - 1 "+", the separator, a digit
        return 5 + 7 * length - 1 + 2
