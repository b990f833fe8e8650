"""Perplexity of a trained model on a corpus at any length (``evaluate``).

Protocol (as in the ALiBi paper, Press et al. 2022, https://arxiv.org/abs/2108.12409):

* ``stride=None``: the validation bytes are cut into non-overlapping windows of ``length``
  tokens and every token of every window is scored, so a token's context ranges from 0 to
  ``length - 1`` tokens.
* ``stride=S``: sliding windows of ``length`` tokens that advance by S; the first window
  scores all its tokens, each later one only its last S, so every scored token after the
  first window sees at least ``length - S`` tokens of context.

Either way, when ``length`` (or S) does not divide the number of targets, a last window ends
at the last target and scores only the ones not scored yet (with more context than the rest),
so every length scores exactly the same target bytes.

Documents (a corpus's ``val_documents``: pg19's books, the files of a text directory or glob):
windows never span two documents. Each document is cut into windows by itself, as above, its
first byte being context only; a document of fewer than ``length + 1`` bytes (``length``
inputs and their targets) is skipped at that length. So with documents, longer lengths may
score fewer documents and bytes than shorter ones: each record says how many it scored
(``documents``, null for a corpus that is one stream, and ``tokens``).

Perplexity is exp(mean NLL) over the scored tokens. So that runs on different tokenizers
compare (a run on bytes beside one on BPE tokens), each record also counts the ``bytes`` and
``words`` of the text its scored tokens cover (a token's bytes belong to the window that scores
it; a word, a maximal run of bytes that are not ASCII whitespace, to the window that scores its
first byte) and gives ``bits_per_byte`` = total NLL / ln 2 / bytes and ``word_ppl`` =
exp(total NLL / words), lm-evaluation-harness's word perplexity. With byte tokens, bits per
byte is mean NLL / ln 2.

LongPPL (posbench/evaluation/longppl.py): given ``key_tokens``, a selection of the targets of
each batch of windows, a record also holds ``longppl``, exp(mean NLL) over the selected targets
that are scored, and ``key_tokens``, how many (``longppl`` null when none is).

Where in the window the loss rises: each non-overlapping record also holds
``loss_by_position``, the mean NLL of the tokens at each bucket of positions
(``position_buckets``), summed over every window. Sliding-window records omit it: their scored
positions are only the window's last ``stride``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from itertools import islice, pairwise
from typing import Any, Protocol

import torch
from torch import nn
from tqdm.auto import tqdm

from posbench.data import Bytes, Offsets, byte_is_whitespace, gather_windows
from posbench.evaluation.compiled import WindowPasses, compiled_for_evaluation
from posbench.evaluation.memory import fitting_batch_size
from posbench.evaluation.positions import RandomPositions, positions_record
from posbench.model import Transformer
from posbench.model.random_positions import PositionDraw
from posbench.system.precision import autocast

TOKENS_PER_BATCH = 65536  # default eval batch: about this many tokens per forward pass
BUCKETS_PER_TRAIN_LENGTH = 8  # equal position buckets inside the training length
BUCKETS_PER_OCTAVE = 4  # equal position buckets in each doubling beyond it (fewer if needed)
MAX_POSITION_BUCKETS = 64


class KeySelection(Protocol):
    """LongPPL's key tokens of a batch of windows (longppl.KeyTokens)."""

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        """Rows (B, T + 1) of windows' inputs and their next tokens -> (B, T) bool."""

    def memory_bytes(self, batch_size: int, length: int) -> int:
        """The memory selecting them adds for ``batch_size`` windows of ``length`` tokens, after
        the run's own forward pass (which has ended by then)."""


def position_buckets(length: int, train_seq_len: int) -> list[tuple[int, int]]:
    """The [start, end) position buckets that split a window of ``length`` tokens.

    Positions below the training length S are cut into BUCKETS_PER_TRAIN_LENGTH equal
    buckets; beyond it each doubling [S * 2^k, S * 2^(k+1)) is cut into BUCKETS_PER_OCTAVE
    equal buckets, so the buckets stay fine near S, where extrapolation starts, and their
    number grows with log(length / S), never beyond MAX_POSITION_BUCKETS (fewer per doubling
    for extreme ratios). S is always a boundary when it lies inside the window. Edges are
    rounded down to integers; the last bucket ends at ``length``. E.g. S = 128, length 512:
    0, 16, ..., 112, 128, 160, 192, 224, 256, 320, 384, 448, 512.
    """
    assert length >= 1 and train_seq_len >= 1
    S = train_seq_len
    for per_octave in (BUCKETS_PER_OCTAVE, 2, 1):
        edges = {S * i // BUCKETS_PER_TRAIN_LENGTH for i in range(BUCKETS_PER_TRAIN_LENGTH)}
        octave = S
        while octave < length:
            edges |= {octave * (per_octave + j) // per_octave for j in range(per_octave)}
            octave *= 2
        ends = [*sorted(e for e in edges if e < length), length]
        if len(ends) - 1 <= MAX_POSITION_BUCKETS:
            return list(pairwise(ends))
    raise AssertionError(f"length / train_seq_len = {length / S:g} needs over 2^56 buckets")


def loss_by_position(
    position_nll: torch.Tensor, position_tokens: torch.Tensor, train_seq_len: int
) -> list[dict[str, Any]]:
    """The ``loss_by_position`` of a record: ``position_nll`` (T,) float64 holds, for each
    position of the window, the NLL summed over every window, and ``position_tokens`` (T,) how
    many targets were scored there (the last window may score only its tail). The first
    window is scored entirely, so no bucket is empty."""
    buckets = []
    for start, end in position_buckets(len(position_nll), train_seq_len):
        tokens = int(position_tokens[start:end].sum())
        nll = position_nll[start:end].sum().item() / tokens
        buckets.append({"start": start, "end": end, "nll": nll, "tokens": tokens})
    return buckets


def windows(n_tokens: int, length: int, stride: int | None) -> Iterator[tuple[int, int]]:
    """(start, first scored index) of each window over ``n_tokens`` tokens, i.e. over the
    ``n_tokens - 1`` targets tokens[1:], every one of which is scored exactly once.

    A window holds inputs ``[start, start + length)`` and predicts the next token of each;
    tokens before ``first scored index`` (relative to start) are context only. Windows advance
    by ``stride`` (non-overlapping: by ``length``); when the targets do not fill a whole last
    step, the last window ends at the last target and scores only the targets not scored yet,
    so every length scores the same bytes.
    """
    targets = n_tokens - 1
    if targets < length:
        return
    start, scored_until = 0, 0  # inputs [0, scored_until) have had their targets scored
    while scored_until < targets:
        yield start, scored_until - start
        scored_until = start + length
        start = min(start + (stride or length), targets - length)


def document_bounds(n_tokens: int, documents: Offsets | None) -> list[tuple[int, int]]:
    """The [begin, end) of each document of a split of ``n_tokens`` tokens whose documents
    start at ``documents`` (int64 offsets, increasing from 0); None: one stream, one span."""
    if documents is None:
        return [(0, n_tokens)]
    starts = documents.tolist()
    return list(zip(starts, [*starts[1:], n_tokens], strict=True))


def document_windows(
    bounds: Sequence[tuple[int, int]], length: int, stride: int | None
) -> Iterator[tuple[int, int]]:
    """``windows`` cut inside each document's [begin, end) by itself, as (start in the split,
    first scored index): no window crosses a document's end, and a document of fewer than
    ``length + 1`` tokens has none."""
    for begin, end in bounds:
        for start, first_scored in windows(end - begin, length, stride):
            yield begin + start, first_scored


def count_windows(n_tokens: int, length: int, stride: int | None) -> int:
    """How many windows ``windows`` gives, without listing them (a split may hold billions):
    the first, then one per step of the rest of the targets, the last one cut short."""
    targets = n_tokens - 1
    if targets < length:
        return 0
    return 1 + -(-(targets - length) // (stride or length))


def unsupported(
    length: int,
    stride: int | None,
    reason: str,
    scaling: dict[str, Any],
    positions: RandomPositions | None = None,
) -> dict[str, Any]:
    """The record of a length that cannot be measured; ``scaling`` as in ``scaling_record``."""
    return {
        "length": length,
        "stride": stride,
        "ppl": None,
        "bits_per_byte": None,
        "word_ppl": None,
        "tokens": 0,
        "bytes": 0,
        "words": 0,
        "status": "unsupported",
        "reason": reason,
        "compile_s": None,
        **scaling,
        **positions_record(positions, 0),
    }


def beyond_max_length(
    model: Transformer, length: int, positions: RandomPositions | None = None
) -> str | None:
    """Why ``model`` cannot be evaluated at ``length`` (at ``positions``; None: 0..L-1), or None
    when it can."""
    if positions is not None:
        return positions.unsupported_reason(length)
    if model.max_length is not None and length > model.max_length:
        return (
            f"the {model.encoding.config.name} encoding represents {model.max_length} "
            f"positions; {model.encoding.beyond_max_length_remedy(length)}"
        )
    return None


@torch.inference_mode()
def evaluate_length(
    model: Transformer,
    tokens: Bytes,
    length: int,
    stride: int | None = None,
    batch_size: int | None = None,
    train_seq_len: int | None = None,
    precision: str = "fp32",
    documents: Offsets | None = None,
    positions: RandomPositions | None = None,
    token_bytes: Bytes | None = None,
    word_starts: Bytes | None = None,
    has_words: bool = True,
    key_tokens: KeySelection | None = None,
    compiled_model: nn.Module | None = None,
) -> dict[str, Any]:
    """One results.json eval record: the model's perplexity on ``tokens`` at ``length``, the
    eval-time extension (``scaling``) its encoding applied there and, for non-overlapping
    windows, ``loss_by_position`` with ``train_seq_len`` as a bucket boundary (None: the
    window is bucketed as if it were the training length). ``precision`` is that of the
    forward passes (posbench.system.precision.autocast); the NLL is summed in float64 either way.
    ``documents``: where each document of ``tokens`` starts (None: one stream); windows stay
    inside a document and the record's ``documents`` counts those scored. ``positions``: each
    window at its randomized positions (None: at 0..L-1). ``token_bytes`` and ``word_starts``:
    the bytes and word starts of each token (a corpus of tokens' ``val_token_bytes`` and
    ``val_word_starts``; None: ``tokens`` are bytes, which count themselves). Without
    ``has_words`` (bytes that are not text: the synthetic corpus) ``word_ppl`` and ``words``
    are None: whitespace bytes there delimit no words. ``key_tokens``: LongPPL's selection of
    each batch's targets (None: no LongPPL). ``compiled_model``: ``model`` compiled
    (compiled_for_evaluation), which then runs the windows, every batch at one shape
    (WindowPasses), and the record's ``compile_s`` is its compile's (None: ``model`` runs them).
    ``tokens`` (a tensor or a numpy array, maybe a memory map) is read one batch of windows at a
    time."""
    assert stride is None or 0 < stride <= length, "stride must be in (0, length]"
    model.eval()  # no dropout; eval-time extensions (RoPE scaling) apply
    scaling = model.encoding.scaling_record(length)
    bounds = document_bounds(len(tokens), documents)
    long_documents = [(begin, end) for begin, end in bounds if end - begin > length]
    n_spans = sum(count_windows(end - begin, length, stride) for begin, end in long_documents)
    device = next(model.parameters()).device
    reason = beyond_max_length(model, length, positions)
    if reason is None and not n_spans:
        reason = too_short(len(tokens), documents, length)
    if reason is None:
        batch_size = min(batch_size or max(1, TOKENS_PER_BATCH // length), n_spans)
        batch_size, reason = fitting_batch_size(
            model,
            length,
            batch_size,
            device,
            consecutive=positions is None or positions.consecutive,
            then=None if key_tokens is None else key_tokens.memory_bytes,
        )
    if reason is not None:
        return {
            **unsupported(length, stride, reason, scaling, positions),
            "documents": None if documents is None else 0,
        }
    position_nll = torch.zeros(length, dtype=torch.float64, device=device)  # summed on the device
    position_tokens = torch.zeros(length, dtype=torch.long, device=device)
    text = torch.zeros(2, dtype=torch.long, device=device)  # bytes and words scored
    key = torch.zeros(2, dtype=torch.float64, device=device)  # key tokens' NLL and count
    spans = document_windows(long_documents, length, stride)
    passes = WindowPasses(model, compiled_model, batch_size)
    with tqdm(total=n_spans, desc=f"eval length {length}", unit="window", leave=False) as bar:
        while batch := list(islice(spans, batch_size)):
            starts = [s for s, _ in batch]
            run = passes.rows(starts)  # compiled: padded to the full batch
            rows = gather_windows(tokens, run, length + 1).to(device)  # (B, T+1)
            at = PositionDraw() if positions is None else positions.of_windows(length, run)
            at = at.to(device)
            with autocast(precision, device):
                # (B, T) float32, without the (B, T, vocab) logits where they are large
                nll = passes(
                    rows[:, :-1],
                    at.positions,
                    targets=rows[:, 1:],
                    reduction="none",
                    distances=at.distances,
                )
            rows, nll = rows[: len(batch)], nll[: len(batch)]  # the padding's losses dropped
            first = torch.tensor([f for _, f in batch], device=device)  # (B,)
            is_scored = torch.arange(length, device=device) >= first[:, None]  # (B, T)
            position_nll += nll.double().masked_fill(~is_scored, 0.0).sum(0)  # (T,)
            position_tokens += is_scored.sum(0)
            if key_tokens is not None:
                with autocast(precision, device):
                    is_key = key_tokens(rows) & is_scored  # (B, T)
                key += torch.stack([nll.double()[is_key].sum(), is_key.sum().double()])
            counts = scored_text(rows, starts, token_bytes, word_starts).to(device)  # (2, B, T)
            text += (counts * is_scored).sum((1, 2))
            bar.update(len(batch))
    scored = int(position_tokens.sum())
    total_nll = position_nll.sum().item()
    mean_nll = total_nll / scored
    n_bytes, n_words = text.tolist()
    extra: dict[str, Any] = {}
    if key_tokens is not None:
        key_nll, n_key = key.tolist()
        longppl = perplexity(key_nll / n_key) if n_key else None
        extra = {"longppl": longppl, "key_tokens": int(n_key)}
    if stride is None:
        buckets = loss_by_position(position_nll, position_tokens, train_seq_len or length)
        extra["loss_by_position"] = buckets
    return {
        "length": length,
        "stride": stride,
        "ppl": perplexity(mean_nll),
        "bits_per_byte": total_nll / n_bytes / math.log(2),
        "word_ppl": perplexity(total_nll / n_words) if n_words and has_words else None,
        "tokens": scored,
        "bytes": n_bytes,
        "words": n_words if has_words else None,
        "documents": None if documents is None else len(long_documents),
        "status": "ok",
        "reason": None,
        "precision": precision,
        "compile_s": passes.compile_s,
        **scaling,
        **positions_record(positions, n_spans),
        **extra,
    }


# The largest mean NLL whose exponential is a float: past it a perplexity is infinite.
MAX_FINITE_NLL = math.log(sys.float_info.max)


def perplexity(mean_nll: float) -> float:
    """exp(``mean_nll``); inf where that overflows a float (a word perplexity over few words:
    hundreds of nats per word), never an OverflowError."""
    return math.exp(mean_nll) if mean_nll <= MAX_FINITE_NLL else math.inf


def scored_text(
    rows: torch.Tensor,
    starts: Sequence[int],
    token_bytes: Bytes | None,
    word_starts: Bytes | None,
) -> torch.Tensor:
    """The bytes and word starts of each target of windows ``rows`` (B, T + 1) that start at
    ``starts`` -> (2, B, T): read from ``token_bytes`` and ``word_starts`` for tokens, counted
    from the bytes themselves when they are None (a word starts at a byte that is not
    whitespace after one that is), on ``rows``' device: no copy of the windows back from it."""
    if token_bytes is None or word_starts is None:
        space = byte_is_whitespace(rows)  # (B, T + 1)
        return torch.stack([torch.ones_like(rows[:, 1:]), ~space[:, 1:] & space[:, :-1]])
    targets = [start + 1 for start in starts]
    width = rows.shape[1] - 1
    return torch.stack(
        [gather_windows(token_bytes, targets, width), gather_windows(word_starts, targets, width)]
    )


def too_short(n_tokens: int, documents: Offsets | None, length: int, option: str = "length") -> str:
    """Why no window of ``length`` (set by ``option``) fits in a split of ``n_tokens`` tokens
    whose documents start at ``documents``."""
    longest = max(end - begin for begin, end in document_bounds(n_tokens, documents))
    what = "validation split" if documents is None else "longest validation document"
    return f"the {what} has {longest} tokens; {option} {length} needs at least {length + 1}"


def evaluate(
    model: Transformer,
    tokens: Bytes,
    lengths: Sequence[int],
    stride: int | None = None,
    batch_size: int | None = None,
    max_tokens: int | None = None,
    train_seq_len: int | None = None,
    precision: str = "fp32",
    documents: Offsets | None = None,
    positions: RandomPositions | None = None,
    token_bytes: Bytes | None = None,
    word_starts: Bytes | None = None,
    has_words: bool = True,
    key_tokens: KeySelection | None = None,
    compiled: bool = False,
) -> list[dict[str, Any]]:
    """Evaluate ``model`` on ``tokens`` (a tensor or a numpy array: bytes, or a tokenizer's
    ids with each one's ``token_bytes`` and ``word_starts``) at each length, in ``precision``,
    at ``positions`` (None: 0..L-1); ``has_words``: whether the bytes are text, with words
    (``word_ppl``).

    Every length scores the same leading ``max_tokens`` tokens (all of them when ``None``),
    so perplexities at different lengths are measured on the same text. With ``documents``
    (where each document of ``tokens`` starts) windows stay inside a document, ``max_tokens``
    cuts the document it falls in (its head stays a document), and a length skips the
    documents shorter than ``length + 1`` tokens. ``compiled``: the forward passes run
    through torch.compile, compiled once per length (posbench/evaluation/compiled.py).
    Returns results.json eval records: length, stride, ppl, bits_per_byte, word_ppl, tokens,
    bytes, words, documents,
    status, reason, precision (of measured records), compile_s (null when not compiled),
    scaling, scaling_factor, positions, random_positions, position_draws and
    (non-overlapping windows) loss_by_position, bucketed around ``train_seq_len``; with
    ``key_tokens``, longppl and key_tokens.
    """
    if max_tokens is not None:
        tokens = tokens[: max_tokens + 1]
        if token_bytes is not None and word_starts is not None:
            token_bytes, word_starts = token_bytes[: len(tokens)], word_starts[: len(tokens)]
        if documents is not None:
            documents = documents[documents < len(tokens)]
    with compiled_for_evaluation(model) if compiled else nullcontext() as compiled_model:
        return [
            evaluate_length(
                model,
                tokens,
                n,
                stride,
                batch_size,
                train_seq_len,
                precision,
                documents,
                positions,
                token_bytes,
                word_starts,
                has_words,
                key_tokens,
                compiled_model,
            )
            for n in lengths
        ]
