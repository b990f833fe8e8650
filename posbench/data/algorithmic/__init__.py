"""Algorithmic length-generalization tasks: problems of a size, generated from a seed.

The suites the field's small-model results come from: Ruoss et al. 2023 ("Randomized
Positional Encodings Boost Length Generalization of Transformers", the Chomsky-hierarchy
tasks of google-deepmind/randomized_positional_encodings) and Kazemnejad et al. 2023 ("The
Impact of Positional Encoding on Length Generalization in Transformers",
McGill-NLP/length-generalization). ``base`` holds ``AlgorithmicTask`` (the prompt, separator,
answer format, training by problem length, evaluation by problem length), ``curriculum`` the
distributions training draws sizes from, ``kazemnejad`` what Kazemnejad et al.'s tasks
share; every other module is one task, listed in ``ALGORITHMIC_TASKS`` with its config.
"""

from __future__ import annotations

from posbench.data.algorithmic.addition import Addition, AdditionDataConfig
from posbench.data.algorithmic.base import AlgorithmicDataConfig, AlgorithmicTask
from posbench.data.algorithmic.binary_addition import BinaryAddition, BinaryAdditionDataConfig
from posbench.data.algorithmic.binary_multiplication import (
    BinaryMultiplication,
    BinaryMultiplicationDataConfig,
)
from posbench.data.algorithmic.bucket_sort import BucketSort, BucketSortDataConfig
from posbench.data.algorithmic.compute_sqrt import ComputeSqrt, ComputeSqrtDataConfig
from posbench.data.algorithmic.counting import Counting, CountingDataConfig
from posbench.data.algorithmic.curriculum import Curriculum
from posbench.data.algorithmic.cycle_navigation import CycleNavigation, CycleNavigationDataConfig
from posbench.data.algorithmic.duplicate_string import DuplicateString, DuplicateStringDataConfig
from posbench.data.algorithmic.even_pairs import EvenPairs, EvenPairsDataConfig
from posbench.data.algorithmic.lego import Lego, LegoDataConfig
from posbench.data.algorithmic.missing_duplicate_string import (
    MissingDuplicateString,
    MissingDuplicateStringDataConfig,
)
from posbench.data.algorithmic.modular_arithmetic import (
    ModularArithmetic,
    ModularArithmeticDataConfig,
)
from posbench.data.algorithmic.modular_arithmetic_brackets import (
    ModularArithmeticBrackets,
    ModularArithmeticBracketsDataConfig,
)
from posbench.data.algorithmic.odds_first import OddsFirst, OddsFirstDataConfig
from posbench.data.algorithmic.parity_check import ParityCheck, ParityCheckDataConfig
from posbench.data.algorithmic.polynomial_evaluation import (
    PolynomialEvaluation,
    PolynomialEvaluationDataConfig,
)
from posbench.data.algorithmic.reverse_string import ReverseString, ReverseStringDataConfig
from posbench.data.algorithmic.solve_equation import SolveEquation, SolveEquationDataConfig
from posbench.data.algorithmic.sorting import Sorting, SortingDataConfig
from posbench.data.algorithmic.stack_manipulation import (
    StackManipulation,
    StackManipulationDataConfig,
)
from posbench.data.algorithmic.summation import Summation, SummationDataConfig

__all__ = [
    "ALGORITHMIC_SCHEMAS",
    "ALGORITHMIC_TASKS",
    "AlgorithmicDataConfig",
    "AlgorithmicTask",
    "Curriculum",
]

# Each task by its ``data.source``, and the schema of its ``data`` config.
ALGORITHMIC_TASKS: dict[str, type[AlgorithmicTask]] = {
    "parity_check": ParityCheck,
    "even_pairs": EvenPairs,
    "modular_arithmetic": ModularArithmetic,
    "cycle_navigation": CycleNavigation,
    "reverse_string": ReverseString,
    "binary_addition": BinaryAddition,
    "binary_multiplication": BinaryMultiplication,
    "bucket_sort": BucketSort,
    "compute_sqrt": ComputeSqrt,
    "duplicate_string": DuplicateString,
    "missing_duplicate_string": MissingDuplicateString,
    "odds_first": OddsFirst,
    "addition": Addition,
    "sorting": Sorting,
    "summation": Summation,
    "polynomial_evaluation": PolynomialEvaluation,
    "counting": Counting,
    "lego": Lego,
    "stack_manipulation": StackManipulation,
    "modular_arithmetic_brackets": ModularArithmeticBrackets,
    "solve_equation": SolveEquation,
}
ALGORITHMIC_SCHEMAS: dict[str, type[AlgorithmicDataConfig]] = {
    "parity_check": ParityCheckDataConfig,
    "even_pairs": EvenPairsDataConfig,
    "modular_arithmetic": ModularArithmeticDataConfig,
    "cycle_navigation": CycleNavigationDataConfig,
    "reverse_string": ReverseStringDataConfig,
    "binary_addition": BinaryAdditionDataConfig,
    "binary_multiplication": BinaryMultiplicationDataConfig,
    "bucket_sort": BucketSortDataConfig,
    "compute_sqrt": ComputeSqrtDataConfig,
    "duplicate_string": DuplicateStringDataConfig,
    "missing_duplicate_string": MissingDuplicateStringDataConfig,
    "odds_first": OddsFirstDataConfig,
    "addition": AdditionDataConfig,
    "sorting": SortingDataConfig,
    "summation": SummationDataConfig,
    "polynomial_evaluation": PolynomialEvaluationDataConfig,
    "counting": CountingDataConfig,
    "lego": LegoDataConfig,
    "stack_manipulation": StackManipulationDataConfig,
    "modular_arithmetic_brackets": ModularArithmeticBracketsDataConfig,
    "solve_equation": SolveEquationDataConfig,
}
