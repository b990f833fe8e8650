"""Perplexity of a trained model at any length: the "test long" half of posbench.

Protocol (as in the ALiBi paper, Press et al. 2022, https://arxiv.org/abs/2108.12409):

* ``stride=None``: the validation bytes are cut into non-overlapping windows of ``length``
  tokens and every token of every window is scored, so a token's context ranges from 0 to
  ``length - 1`` tokens.
* ``stride=S``: sliding windows of ``length`` tokens that advance by S; the first window
  scores all its tokens, each later one only its last S, so every scored token after the
  first window sees at least ``length - S`` tokens of context.

Perplexity is exp(mean NLL) over the scored tokens; with byte tokens, bits per byte is
mean NLL / ln 2.

Each record also names the eval-time extension it measured (``scaling``: "none" when the model
is evaluated as trained, else e.g. "yarn" for a RoPE run, with the factor in
``scaling_factor``); ``rope_scaling_overrides`` builds that extension for a trained rope run.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from posbench.config import resolve_device
from posbench.data import load_corpus
from posbench.errors import PosbenchError
from posbench.memory import fitting_batch_size
from posbench.model import Transformer
from posbench.precision import autocast
from posbench.runs import load_run

TOKENS_PER_BATCH = 65536  # default eval batch: about this many tokens per forward pass


def windows(n_tokens: int, length: int, stride: int | None) -> Iterator[tuple[int, int]]:
    """(start, first scored index) of each window over ``n_tokens`` inputs with targets.

    A window holds inputs ``[start, start + length)`` and predicts the next token of each;
    tokens before ``first scored index`` (relative to start) are context only.
    """
    step = stride or length
    for start in range(0, n_tokens - length, step):
        yield start, 0 if start == 0 or stride is None else length - stride


def unsupported(
    length: int, stride: int | None, reason: str, scaling: dict[str, Any]
) -> dict[str, Any]:
    """The record of a length that cannot be measured; ``scaling`` as in ``scaling_record``."""
    return {
        "length": length,
        "stride": stride,
        "ppl": None,
        "bits_per_byte": None,
        "tokens": 0,
        "status": "unsupported",
        "reason": reason,
        **scaling,
    }


@torch.inference_mode()
def evaluate_length(
    model: Transformer,
    tokens: torch.Tensor,
    length: int,
    stride: int | None = None,
    batch_size: int | None = None,
    precision: str = "fp32",
) -> dict[str, Any]:
    """One results.json eval record: the model's perplexity on ``tokens`` at ``length``, and
    the eval-time extension (``scaling``) its encoding applied there. ``precision`` is that of
    the forward passes (posbench.precision.autocast); the NLL is summed in float64 either way."""
    assert stride is None or 0 < stride <= length, "stride must be in (0, length]"
    model.eval()  # no dropout; eval-time extensions (RoPE scaling) apply
    scaling = model.encoding.scaling_record(length)
    if model.max_length is not None and length > model.max_length:
        return unsupported(
            length,
            stride,
            f"the {model.encoding.config.name} encoding represents {model.max_length} "
            f"positions; retrain with encoding.max_length>={length}",
            scaling,
        )
    spans = list(windows(len(tokens), length, stride))
    if not spans:
        return unsupported(
            length,
            stride,
            f"the validation split has {len(tokens)} tokens; length {length} needs "
            f"at least {length + 1}",
            scaling,
        )
    device = next(model.parameters()).device
    batch_size = min(batch_size or max(1, TOKENS_PER_BATCH // length), len(spans))
    batch_size, shortfall = fitting_batch_size(model, length, batch_size, device)
    if shortfall is not None:
        return unsupported(length, stride, shortfall, scaling)
    total_nll = torch.zeros((), dtype=torch.float64, device=device)  # summed on the device
    scored = 0
    with tqdm(total=len(spans), desc=f"eval length {length}", unit="window", leave=False) as bar:
        for i in range(0, len(spans), batch_size):
            batch = spans[i : i + batch_size]
            rows = torch.stack([tokens[s : s + length + 1] for s, _ in batch]).long().to(device)
            with autocast(precision, device):
                logits = model(rows[:, :-1])  # (B, T, vocab)
            nll = F.cross_entropy(logits.transpose(1, 2).float(), rows[:, 1:], reduction="none")
            first = torch.tensor([f for _, f in batch], device=device)  # (B,)
            is_scored = torch.arange(length, device=device) >= first[:, None]  # (B, T)
            total_nll += nll.double().masked_fill(~is_scored, 0.0).sum()
            scored += sum(length - f for _, f in batch)
            bar.update(len(batch))
    mean_nll = total_nll.item() / scored
    return {
        "length": length,
        "stride": stride,
        "ppl": math.exp(mean_nll),
        "bits_per_byte": mean_nll / math.log(2),
        "tokens": scored,
        "status": "ok",
        "reason": None,
        "precision": precision,
        **scaling,
    }


def evaluate(
    model: Transformer,
    tokens: torch.Tensor,
    lengths: Sequence[int],
    stride: int | None = None,
    batch_size: int | None = None,
    max_tokens: int | None = None,
    precision: str = "fp32",
) -> list[dict[str, Any]]:
    """Evaluate ``model`` on the byte tensor ``tokens`` at each length, in ``precision``.

    Every length scores the same leading ``max_tokens`` tokens (all of them when ``None``),
    so perplexities at different lengths are measured on the same text.
    Returns results.json eval records: length, stride, ppl, bits_per_byte, tokens, status,
    reason, precision (of measured records), scaling, scaling_factor.
    """
    if max_tokens is not None:
        tokens = tokens[: max_tokens + 1]
    return [evaluate_length(model, tokens, n, stride, batch_size, precision) for n in lengths]


def evaluate_run(
    run_dir: str | Path,
    lengths: Sequence[int],
    stride: int | None = None,
    batch_size: int | None = None,
    device: str = "auto",
    max_tokens: int | None = None,
    encoding_overrides: Mapping[str, Any] | None = None,
    precision: str | None = None,
) -> list[dict[str, Any]]:
    """Evaluate a trained run on its own validation split; returns results.json eval records.

    ``max_tokens`` and ``precision`` default to the run's ``eval.max_tokens`` and
    ``eval.precision``, so the numbers are comparable with the ones measured at the end of
    training. ``encoding_overrides`` are merged over the
    run's encoding config before its weights are loaded (e.g. ``rope_scaling_overrides``).
    """
    model, cfg = load_run(run_dir, resolve_device(device), encoding_overrides)
    corpus = load_corpus(cfg.data)
    if max_tokens is None:
        max_tokens = cfg.eval.max_tokens
    if precision is None:  # runs from before eval.precision existed evaluated in fp32
        precision = OmegaConf.select(cfg, "eval.precision", default="fp32")
    return evaluate(model, corpus.val, lengths, stride, batch_size, max_tokens, precision)


def rope_scaling_overrides(
    cfg: DictConfig, method: str, factor: float | None = None
) -> dict[str, Any]:
    """Encoding overrides that evaluate the rope run configured by ``cfg`` with an eval-time
    scaling ``method`` (posbench.encodings.rope.SCALING_METHODS) and ``factor`` (None: from each
    length). The original length is the run's training length, never the evaluation length."""
    if cfg.encoding.name != "rope":
        raise PosbenchError(
            f"RoPE scaling needs a run trained with encoding=rope; this run used "
            f"{cfg.encoding.name!r}"
        )
    trained = OmegaConf.select(cfg, "encoding.scaling.original_length") or cfg.train.seq_len
    return {"scaling": {"method": method, "factor": factor, "original_length": trained}}
