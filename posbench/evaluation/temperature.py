"""``eval.temperature=fit``: DroPE's logit temperature (Gelberg et al. 2025, arXiv 2512.12167),
fitted on the training split and applied at every evaluation length.

A model without positional encoding spreads its attention thinner as the context grows; DroPE
sharpens it again at evaluation: every layer's q.k logits times

    beta(L) = 1 + c ln(L / L_train)      (L <= L_train: beta = 1, the model as trained)

where L is the evaluation length and L_train the training length (``train.seq_len``). ``c`` is
fitted here: at each evaluation length that is a multiple (2x, 4x, ...) of L_train, the beta
that minimises the mean next-token NLL of windows of that length over a calibration slice of
the *training* split (its first CALIBRATION_TOKENS tokens; never the evaluation text) is found
by golden-section search in BETA_RANGE, and c is the least-squares slope of beta - 1 on
ln(L / L_train) through the origin. The reference repository (SakanaAI/DroPE) sets one fixed
``softmax_scale`` for all layers and holds no fitting code, so the fit follows the paper's
formula and is this module's: which lengths, which text, which objective.

Each record of a fitted run names it as its eval-time extension: ``scaling`` "temperature",
``scaling_factor`` beta(L), and ``temperature_c`` and ``temperature_fit`` (each fitted length's
own best beta, the calibration tokens per length, the split). Biases of an encoding (ALiBi,
T5, ...) stay unscaled: beta multiplies the queries (``Transformer.set_logit_temperature``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

from omegaconf import DictConfig

from posbench.config import flat_config
from posbench.data import TASKS, Bytes, Offsets
from posbench.errors import PosbenchError
from posbench.evaluation.perplexity import evaluate_length
from posbench.evaluation.positions import RandomPositions
from posbench.model import Transformer

TEMPERATURES = ("none", "fit")  # eval.temperature
CALIBRATION_TOKENS = 16384  # training-split tokens scored per fitted length (at least one window)
BETA_RANGE = (0.25, 4.0)  # where each length's best beta is searched
BETA_TOLERANCE = 1e-3  # the search stops when its bracket is this narrow
GOLDEN = (math.sqrt(5) - 1) / 2


@dataclass(frozen=True)
class TemperatureFit:
    """A fitted ``c`` for a model trained at ``train_length``, and each fitted length's own
    best beta (``betas``) on ``tokens`` calibration tokens of the training split."""

    c: float
    train_length: int
    betas: dict[int, float]
    tokens: int

    def beta(self, length: int) -> float:
        """beta at evaluation ``length``: 1 + c ln(L / L_train), 1 up to the training length."""
        return 1.0 + self.c * math.log(max(1.0, length / self.train_length))

    def record(self, length: int) -> dict[str, Any]:
        """The eval-record fields of a record measured at ``length`` under this temperature."""
        return {
            "scaling": "temperature",
            "scaling_factor": self.beta(length),
            "scaling_factor_setting": None,
            "temperature_c": self.c,
            "temperature_fit": {
                "betas": {str(n): b for n, b in self.betas.items()},
                "tokens": self.tokens,
                "split": "train",
            },
        }


def check_temperature(temperature: str, cfg: DictConfig, lengths: Sequence[int]) -> None:
    """One line when ``temperature`` (``eval.temperature``) cannot apply to the run ``cfg``
    evaluated at ``lengths``: an unknown value, a task (no corpus split to calibrate on), a RoPE
    scaling method beside it (a record names one extension), or no length to fit at."""
    if temperature not in TEMPERATURES:
        raise PosbenchError(
            f"eval.temperature must be one of {', '.join(TEMPERATURES)} (got {temperature!r})"
        )
    if temperature == "none":
        return
    if cfg.data.source in TASKS:
        raise PosbenchError(
            f"eval.temperature=fit calibrates on a corpus's training split; data={cfg.data.source}"
            " is a task, scored by its answers: drop eval.temperature"
        )
    # A hybrid's RoPE layers scale under encoding.encodings.rope.scaling.method.
    scaled = sorted(
        (key, method)
        for key, method in flat_config(cfg.encoding).items()
        if key.endswith("scaling.method") and method != "none"
    )
    if scaled:
        key, method = scaled[0]
        raise PosbenchError(
            f"eval.temperature=fit and encoding.{key}={method} are two eval-time "
            "extensions and a record names one: evaluate them in two runs or re-evaluations"
        )
    if not fitted_lengths(lengths, cfg.train.seq_len):
        raise PosbenchError(
            "eval.temperature=fit fits beta at the evaluation lengths that are multiples of "
            f"train.seq_len={cfg.train.seq_len} (2x, 4x, ...); {list(lengths)} has none: add one"
        )


def fitted_lengths(lengths: Sequence[int], train_length: int) -> list[int]:
    """The evaluation lengths beta is fitted at: multiples of the training length, past it."""
    return sorted({n for n in lengths if n > train_length and n % train_length == 0})


def golden_section_minimum(loss: Callable[[float], float], lo: float, hi: float) -> float:
    """The minimiser of a unimodal ``loss`` on [lo, hi], to within BETA_TOLERANCE."""
    a, b = lo, hi
    x1, x2 = b - GOLDEN * (b - a), a + GOLDEN * (b - a)
    f1, f2 = loss(x1), loss(x2)
    while b - a > BETA_TOLERANCE:
        if f1 <= f2:  # the minimum lies in [a, x2]
            b, x2, f2 = x2, x1, f1
            x1 = b - GOLDEN * (b - a)
            f1 = loss(x1)
        else:  # in [x1, b]
            a, x1, f1 = x1, x2, f2
            x2 = a + GOLDEN * (b - a)
            f2 = loss(x2)
    return (a + b) / 2


def slope_through_origin(points: dict[float, float]) -> float:
    """The least-squares c of y = c x over ``points`` {x: y}."""
    return sum(x * y for x, y in points.items()) / sum(x * x for x in points)


def calibration_nll(
    model: Transformer,
    tokens: Bytes,
    length: int,
    precision: str,
    documents: Offsets | None,
    positions: RandomPositions | None,
    beta: float,
) -> float:
    """The mean next-token NLL of ``tokens``' windows of ``length`` under logit temperature
    ``beta``; infinite when no window fits."""
    with logit_temperature(model, beta):
        record = evaluate_length(
            model,
            tokens,
            length,
            precision=precision,
            documents=documents,
            positions=positions,
            has_words=False,  # only the NLL is read
        )
    return math.log(record["ppl"]) if record["status"] == "ok" else math.inf


@contextmanager
def logit_temperature(model: Transformer, beta: float) -> Iterator[None]:
    """``model``'s logits times ``beta`` inside the block, as trained again after it."""
    model.set_logit_temperature(beta)
    try:
        yield
    finally:
        model.set_logit_temperature(1.0)


def fit_temperature(
    model: Transformer,
    train_tokens: Bytes,
    train_length: int,
    lengths: Sequence[int],
    precision: str = "fp32",
    documents: Offsets | None = None,
    positions: RandomPositions | None = None,
) -> TemperatureFit:
    """Fit c on the training split ``train_tokens`` (whose documents start at ``documents``)
    at each of ``lengths`` that is a multiple of ``train_length``, in ``precision``, at
    ``positions`` (None: 0..L-1), as the module docstring says."""
    betas = {}
    for length in fitted_lengths(lengths, train_length):
        tokens = train_tokens[: max(CALIBRATION_TOKENS, length) + 1]
        starts = None if documents is None else documents[documents < len(tokens)]
        loss = partial(calibration_nll, model, tokens, length, precision, starts, positions)
        if math.isfinite(loss(1.0)):  # a window fits in the calibration slice
            betas[length] = golden_section_minimum(loss, *BETA_RANGE)
    if not betas:
        raise PosbenchError(
            f"eval.temperature=fit found no window of {fitted_lengths(lengths, train_length)} "
            "tokens in the training split to calibrate on: evaluate at shorter lengths"
        )
    points = {math.log(n / train_length): b - 1.0 for n, b in betas.items()}
    return TemperatureFit(slope_through_origin(points), train_length, betas, CALIBRATION_TOKENS)
