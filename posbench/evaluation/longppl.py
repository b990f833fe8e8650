"""LongPPL (Fang et al., "What is Wrong with Perplexity for Long-context Language Modeling?",
ICLR 2025, https://arxiv.org/abs/2410.23771): perplexity over the *key tokens* only, the
tokens whose prediction needs the long context.

An evaluator model (another trained run, on the same data and tokenizer) scores each target
x_t of a window of L tokens twice: with the whole window before it, log P(x_t | long), and with
a training-length context, log P(x_t | short). The key tokens are those where

    LSD = log P(x_t | long) - log P(x_t | short) > alpha    (long-short difference; alpha = 2)
    LCL = log P(x_t | long) > beta                          (long-context likelihood; beta = -2)

and the LongPPL of the evaluated run is exp(mean NLL over the key tokens of every window): its
``longppl`` beside its ``ppl`` in the same record, ``key_tokens`` counting them.

The short context: the paper's sliding approximation (``longppl``'s ``find_key_token``, its
trunc_len and sliding_window), never one forward pass per token. Windows of S tokens (S, the
evaluated run's training length: the evaluator then never reads past it) advance by W inside
each window of L tokens (``windows``: the first scores all its targets, each later one its last
W), so a target sees between S - W + 1 and S tokens; W = S / 4 by default (the paper's 1024 of
4096), about L / W windows of S tokens per window of L, 4 L tokens, batched. Targets within
the first S tokens have the same context both ways: never key tokens. With windows of L <= S
tokens nothing is: LongPPL is null.

What differs from the paper: the evaluator shares the run's tokenizer (the paper maps key tokens
between tokenizers by their text offsets); its "short" context is S tokens of the run being
evaluated, not a fixed 4096; and both contexts sit inside posbench's evaluation windows of L
tokens, so "long" is at most L tokens, not a whole book.

The evaluator's two passes cost about five times the evaluated run's own, and a sweep scores
every run with one evaluator on the same windows: each batch's selection is kept under the
cache root (``data.cache_dir``, ``$POSBENCH_CACHE`` or ``~/.cache/posbench``:
``longppl/<evaluator weights' SHA-256>/``), named by the batch's tokens, the autocast dtype
and the selection's settings, and read back when another run is scored on the same batch
(key_token_cache): exactly what the evaluator would compute again.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from posbench.errors import PosbenchError
from posbench.evaluation.memory import inference_memory_bytes
from posbench.evaluation.perplexity import (
    TOKENS_PER_BATCH,
    beyond_max_length,
    count_windows,
    windows,
)
from posbench.model import Transformer
from posbench.runs.directory import WEIGHTS_FILE
from posbench.system.atomic import atomic_write
from posbench.system.cache_root import cache_root

LONGPPL_ALPHA = 2.0  # the paper's thresholds, in nats
LONGPPL_BETA = -2.0
SHORT_STRIDE_DIVISOR = 4  # W = S / 4, as the paper's sliding window of 1024 to its 4096
CACHE_VERSION = 1  # in every cached selection's name: raise it when the selection's arithmetic
# changes, and selections cached before are no longer read


class KeyTokens:
    """LongPPL's key-token selection with an ``evaluator`` model: ``key_tokens(rows)``, rows
    (B, T + 1) of windows' inputs and their next tokens -> (B, T) bool, whether each target is a
    key token (short contexts of ``short_length`` tokens advancing by ``short_stride``); with a
    ``cache`` directory (key_token_cache: one per evaluator's weights), each batch's selection
    is kept there and read back for the same batch."""

    def __init__(
        self,
        evaluator: Transformer,
        short_length: int,
        alpha: float = LONGPPL_ALPHA,
        beta: float = LONGPPL_BETA,
        short_stride: int | None = None,
        cache: Path | None = None,
    ) -> None:
        self.evaluator = evaluator.eval()
        self.short_length = short_length
        self.short_stride = short_stride or max(1, short_length // SHORT_STRIDE_DIVISOR)
        self.alpha, self.beta = alpha, beta
        self.cache = cache

    def log_probs(self, rows: torch.Tensor) -> torch.Tensor:
        """The evaluator's log-probability of each target of ``rows`` (B, n + 1) -> (B, n)."""
        return -self.evaluator(rows[:, :-1], targets=rows[:, 1:], reduction="none")

    def short_log_probs(self, rows: torch.Tensor) -> torch.Tensor:
        """Each target's log-probability with the short context -> (B, T): every short window of
        every row in batches of about TOKENS_PER_BATCH tokens, not one forward pass each."""
        B, n = rows.shape[0], self.short_length
        spans = list(windows(rows.shape[1], n, self.short_stride))
        short_rows = torch.stack([rows[:, s : s + n + 1] for s, _ in spans], 1)  # (B, w, n + 1)
        short_rows = short_rows.flatten(0, 1)  # (B * w, n + 1)
        per_batch = max(1, TOKENS_PER_BATCH // n)
        log_probs = torch.cat([self.log_probs(b) for b in short_rows.split(per_batch)])
        log_probs = log_probs.view(B, len(spans), n)
        short = torch.empty(B, rows.shape[1] - 1, device=rows.device)
        for index, (start, first) in enumerate(spans):
            short[:, start + first : start + n] = log_probs[:, index, first:]
        return short

    def memory_bytes(self, batch_size: int, length: int) -> int:
        """An upper estimate of the memory selecting the key tokens of ``batch_size`` windows of
        ``length`` tokens adds (the run's own pass has ended): the evaluator's pass over the
        whole windows, or its passes over the short windows together with those windows
        (int64 tokens) and their log-probabilities, beside the whole windows' (B, T)."""
        n = self.short_length
        if length <= n:  # no key token: no pass
            return 0
        whole = inference_memory_bytes(self.evaluator, batch_size, length)
        n_short = batch_size * count_windows(length + 1, n, self.short_stride)
        per_pass = min(n_short, max(1, TOKENS_PER_BATCH // n))
        short = inference_memory_bytes(self.evaluator, per_pass, n)
        short += n_short * ((n + 1) * 8 + n * 4) + 2 * batch_size * length * 4
        return max(whole, short)

    @torch.inference_mode()
    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        if rows.shape[1] - 1 <= self.short_length:  # the whole window is short context
            return torch.zeros_like(rows[:, 1:], dtype=torch.bool)
        path = None if self.cache is None else self.cache / f"{self.batch_key(rows)}.safetensors"
        if path is not None and (cached := read_selection(path, rows)) is not None:
            return cached
        long = self.log_probs(rows)  # (B, T)
        is_key = (long - self.short_log_probs(rows) > self.alpha) & (long > self.beta)
        if path is not None:
            atomic_write(path, save({"is_key": is_key.cpu()}))
        return is_key

    def batch_key(self, rows: torch.Tensor) -> str:
        """What names a batch's cached selection: its tokens and everything else the selection
        depends on beside the evaluator's weights (the cache directory is theirs)."""
        device = rows.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        settings = (CACHE_VERSION, tuple(rows.shape), str(rows.dtype), str(dtype), device)
        settings += (self.alpha, self.beta, self.short_length, self.short_stride)
        digest = hashlib.sha256(repr(settings).encode())
        digest.update(rows.cpu().numpy().tobytes())
        return digest.hexdigest()

    def record(self, evaluator_dir: Path) -> dict[str, Any]:
        """How the key tokens were selected, for each LongPPL record."""
        return {
            "longppl_evaluator": str(evaluator_dir.resolve()),
            "longppl_alpha": self.alpha,
            "longppl_beta": self.beta,
            "longppl_short_length": self.short_length,
            "longppl_short_stride": self.short_stride,
        }


def key_token_cache(evaluator_dir: Path, cache_dir: str | None) -> Path:
    """The directory of the selections made with the evaluator run in ``evaluator_dir``, below
    the cache root of ``cache_dir`` (the evaluated run's data.cache_dir): named by its weights'
    SHA-256, so a run trained again, or another run, never reads them."""
    digest = hashlib.sha256((evaluator_dir / WEIGHTS_FILE).read_bytes()).hexdigest()
    return cache_root(cache_dir) / "longppl" / digest


def read_selection(path: Path, rows: torch.Tensor) -> torch.Tensor | None:
    """The selection cached at ``path`` for ``rows`` (B, T + 1) on their device; None where
    there is none, or what is there is not one (the caller selects again and overwrites it)."""
    try:
        is_key = load_file(path)["is_key"]
    except (OSError, SafetensorError, KeyError):
        return None
    if is_key.dtype != torch.bool or is_key.shape != (rows.shape[0], rows.shape[1] - 1):
        return None
    return is_key.to(rows.device)


def check_evaluator(
    cfg: DictConfig, evaluator: Transformer, evaluator_cfg: DictConfig, lengths: list[int]
) -> None:
    """A one-line error when ``evaluator`` (of config ``evaluator_cfg``) cannot select the key
    tokens of the run of ``cfg`` at ``lengths``: other data or tokenizer, or a length past its
    positions."""
    mine, theirs = (
        {k: v for k, v in OmegaConf.to_container(c.data, resolve=True).items() if k != "cache_dir"}
        for c in (cfg, evaluator_cfg)
    )  # where the cache is changes no token
    if mine != theirs:
        differing = sorted(k for k in {*mine, *theirs} if mine.get(k) != theirs.get(k))
        raise PosbenchError(
            "the LongPPL evaluator must be trained on the run's data and tokenizer; its data "
            f"differs in {', '.join(f'data.{k}' for k in differing)}: pass --evaluator a run "
            "of the same data"
        )
    for length in lengths:
        if (reason := beyond_max_length(evaluator, length)) is not None:
            raise PosbenchError(f"the LongPPL evaluator cannot read {length} tokens: {reason}")
