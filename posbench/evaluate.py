"""Perplexity of a trained model at any length: the "test long" half of posbench.

(Over 500 lines because it is the whole evaluation protocol in one place: which windows, at
which positions, inside which documents, scored how, recorded how. Every number posbench
reports is made here one way, so that reading this file is reading the protocol.)

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

Where in the window the loss rises: each non-overlapping record also holds
``loss_by_position``, the mean NLL of the tokens at each bucket of positions
(``position_buckets``), summed over every window. Sliding-window records omit it: their scored
positions are only the window's last ``stride``.

Tasks (``data=passkey``, ``copy``, ``recall``, and the algorithmic ones) are scored on their
answer bytes only: at each length, ``data.val_examples`` examples of exactly that length.
``eval.decode=greedy`` (the default) decodes each answer from the model's own argmax
(posbench/decode.py: the input after an answer byte is the model's prediction of it, not the
true byte); ``teacher_forced`` does not decode. The records add ``decode`` (which),
``accuracy`` (the share of answer bytes the greedy decode got right; null under
teacher_forced), ``sequence_accuracy`` (examples whose answer is right in full: the same under
both, as a decode is right in full exactly when every argmax given the true prefix is),
``teacher_forced_accuracy`` (the share of answer bytes that are the argmax given the true bytes
before them: a rule that repeats the previous answer byte scores high there) and, for passkey,
``accuracy_by_depth`` (the same per needle depth); ``ppl`` and ``bits_per_byte`` are those of
the answer bytes under teacher forcing.

Randomized positions (a run trained with ``train.random_positions=N``, Ruoss et al. 2023): as
the reference (google-deepmind/randomized_positional_encodings) evaluates, each window sits at
its own sorted random subset of L of the positions [0, N), not at 0..L-1 (``eval.positions``:
``auto`` does so for such runs; ``consecutive`` evaluates at 0..L-1 instead, to study what the
model does without them). The subsets are drawn from a generator seeded by the data's seed,
the length and the window, so every run compared on the same data sees the same positions; a
length above N is unsupported. Records say which (``positions``: "random" or "consecutive",
``random_positions``: N, ``position_draws``: how many windows drew a subset).

Each record also names the eval-time extension it measured (``scaling``: "none" when the model
is evaluated as trained, else e.g. "yarn" for a RoPE run, with the factor in
``scaling_factor``); ``rope_scaling_overrides`` builds that extension for a trained rope run.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice, pairwise
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from posbench.config import EvalDecode, choice, resolve_device
from posbench.data import (
    Bytes,
    Corpus,
    Examples,
    Offsets,
    Task,
    byte_is_whitespace,
    gather_windows,
    load_data,
    sample_positions,
)
from posbench.decode import greedy_decode
from posbench.errors import PosbenchError
from posbench.memory import fitting_batch_size
from posbench.model import Transformer
from posbench.precision import autocast
from posbench.runs import load_run

TOKENS_PER_BATCH = 65536  # default eval batch: about this many tokens per forward pass
BUCKETS_PER_TRAIN_LENGTH = 8  # equal position buckets inside the training length
BUCKETS_PER_OCTAVE = 4  # equal position buckets in each doubling beyond it (fewer if needed)
MAX_POSITION_BUCKETS = 64


# The record fields of an evaluation at positions 0..L-1.
CONSECUTIVE = {"positions": "consecutive", "random_positions": None, "position_draws": None}


@dataclass(frozen=True)
class RandomPositions:
    """Randomized positions at evaluation: each window at its own sorted random subset of
    [0, ``n_positions``), drawn as training draws them (posbench.data.sample_positions) from a
    generator seeded by ``seed`` (the data's), the length and the window's ``key`` (its start
    in the split, or a task example's index): the same for every run on the same data, and
    independent of batch sizes and of which other lengths or windows are evaluated."""

    n_positions: int
    seed: int

    def of_windows(self, length: int, keys: Sequence[int]) -> torch.Tensor:
        """The positions of the windows ``keys`` at ``length`` -> (len(keys), length) int64."""
        rows = []
        for key in keys:
            state = np.random.SeedSequence([self.seed, length, key]).generate_state(1, np.uint64)
            generator = torch.Generator().manual_seed(int(state[0]))
            rows.append(sample_positions(self.n_positions, 1, length, generator))
        return torch.cat(rows)

    def unsupported_reason(self, length: int) -> str | None:
        """Why ``length`` distinct positions cannot be drawn, or None when they can."""
        if length <= self.n_positions:
            return None
        return (
            f"randomized positions draw {length} distinct positions from [0, "
            f"{self.n_positions}) (train.random_positions); evaluate lengths <= "
            f"{self.n_positions}, or at 0..L-1 with eval.positions=consecutive"
        )

    def record(self, draws: int) -> dict[str, Any]:
        return {
            "positions": "random",
            "random_positions": self.n_positions,
            "position_draws": draws,
        }


def positions_record(positions: RandomPositions | None, draws: int) -> dict[str, Any]:
    """A record's ``positions``, ``random_positions`` and ``position_draws`` fields."""
    return CONSECUTIVE if positions is None else positions.record(draws)


def eval_positions(cfg: DictConfig, setting: str | None = None) -> RandomPositions | None:
    """Where the run configured by ``cfg`` is evaluated: at randomized positions (for
    ``setting`` random, or auto in a run trained with train.random_positions) or at 0..L-1
    (None). ``setting`` None: the run's ``eval.positions`` (auto for runs from before it)."""
    setting = setting or choice(OmegaConf.select(cfg, "eval.positions", default="auto"))
    n_positions = OmegaConf.select(cfg, "train.random_positions")
    if setting == "consecutive" or (setting == "auto" and n_positions is None):
        return None
    if n_positions is None:
        raise PosbenchError(
            "eval.positions=random draws from [0, train.random_positions), and this run was "
            "trained without train.random_positions; use eval.positions=auto or consecutive"
        )
    return RandomPositions(n_positions, OmegaConf.select(cfg, "data.seed", default=0))


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
) -> dict[str, Any]:
    """One results.json eval record: the model's perplexity on ``tokens`` at ``length``, the
    eval-time extension (``scaling``) its encoding applied there and, for non-overlapping
    windows, ``loss_by_position`` with ``train_seq_len`` as a bucket boundary (None: the
    window is bucketed as if it were the training length). ``precision`` is that of the
    forward passes (posbench.precision.autocast); the NLL is summed in float64 either way.
    ``documents``: where each document of ``tokens`` starts (None: one stream); windows stay
    inside a document and the record's ``documents`` counts those scored. ``positions``: each
    window at its randomized positions (None: at 0..L-1). ``token_bytes`` and ``word_starts``:
    the bytes and word starts of each token (a corpus of tokens' ``val_token_bytes`` and
    ``val_word_starts``; None: ``tokens`` are bytes, which count themselves). ``tokens`` (a
    tensor or a numpy array, maybe a memory map) is read one batch of windows at a time."""
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
            model, length, batch_size, device, consecutive=positions is None
        )
    if reason is not None:
        return {
            **unsupported(length, stride, reason, scaling, positions),
            "documents": None if documents is None else 0,
        }
    position_nll = torch.zeros(length, dtype=torch.float64, device=device)  # summed on the device
    position_tokens = torch.zeros(length, dtype=torch.long, device=device)
    text = torch.zeros(2, dtype=torch.long, device=device)  # bytes and words scored
    spans = document_windows(long_documents, length, stride)
    with tqdm(total=n_spans, desc=f"eval length {length}", unit="window", leave=False) as bar:
        while batch := list(islice(spans, batch_size)):
            starts = [s for s, _ in batch]
            rows = gather_windows(tokens, starts, length + 1).to(device)  # (B, T+1)
            at = None if positions is None else positions.of_windows(length, starts).to(device)
            with autocast(precision, device):
                # (B, T) float32, without the (B, T, vocab) logits where they are large
                nll = model(rows[:, :-1], at, targets=rows[:, 1:], reduction="none")
            first = torch.tensor([f for _, f in batch], device=device)  # (B,)
            is_scored = torch.arange(length, device=device) >= first[:, None]  # (B, T)
            position_nll += nll.double().masked_fill(~is_scored, 0.0).sum(0)  # (T,)
            position_tokens += is_scored.sum(0)
            counts = scored_text(rows, starts, token_bytes, word_starts).to(device)  # (2, B, T)
            text += (counts * is_scored).sum((1, 2))
            bar.update(len(batch))
    scored = int(position_tokens.sum())
    total_nll = position_nll.sum().item()
    mean_nll = total_nll / scored
    n_bytes, n_words = text.tolist()
    by_position = {}
    if stride is None:
        buckets = loss_by_position(position_nll, position_tokens, train_seq_len or length)
        by_position = {"loss_by_position": buckets}
    return {
        "length": length,
        "stride": stride,
        "ppl": math.exp(mean_nll),
        "bits_per_byte": total_nll / n_bytes / math.log(2),
        "word_ppl": math.exp(total_nll / n_words) if n_words else None,
        "tokens": scored,
        "bytes": n_bytes,
        "words": n_words,
        "documents": None if documents is None else len(long_documents),
        "status": "ok",
        "reason": None,
        "precision": precision,
        **scaling,
        **positions_record(positions, n_spans),
        **by_position,
    }


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
) -> list[dict[str, Any]]:
    """Evaluate ``model`` on ``tokens`` (a tensor or a numpy array: bytes, or a tokenizer's
    ids with each one's ``token_bytes`` and ``word_starts``) at each length, in ``precision``,
    at ``positions`` (None: 0..L-1).

    Every length scores the same leading ``max_tokens`` tokens (all of them when ``None``),
    so perplexities at different lengths are measured on the same text. With ``documents``
    (where each document of ``tokens`` starts) windows stay inside a document, ``max_tokens``
    cuts the document it falls in (its head stays a document), and a length skips the
    documents shorter than ``length + 1`` tokens.
    Returns results.json eval records: length, stride, ppl, bits_per_byte, word_ppl, tokens,
    bytes, words, documents,
    status, reason, precision (of measured records), scaling, scaling_factor, positions,
    random_positions, position_draws and
    (non-overlapping windows) loss_by_position, bucketed around ``train_seq_len``.
    """
    if max_tokens is not None:
        tokens = tokens[: max_tokens + 1]
        if token_bytes is not None and word_starts is not None:
            token_bytes, word_starts = token_bytes[: len(tokens)], word_starts[: len(tokens)]
        if documents is not None:
            documents = documents[documents < len(tokens)]
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
        )
        for n in lengths
    ]


# a task length not measured
NOT_SCORED = dict.fromkeys(["decode", "accuracy", "sequence_accuracy", "teacher_forced_accuracy"])


def answer_scores(
    teacher_forced: torch.Tensor,
    decoded: torch.Tensor | None,
    answer_bytes: torch.Tensor,
    depth_percent: torch.Tensor | None = None,
) -> dict[str, Any]:
    """``accuracy`` (answer bytes the greedy decode got right / answer bytes; None when not
    ``decoded``), ``sequence_accuracy`` (examples with every answer byte right / examples),
    ``teacher_forced_accuracy`` (answer bytes right given the true prefix / answer bytes) and,
    with ``depth_percent``, ``accuracy_by_depth``: the same three per needle depth.
    ``teacher_forced``, ``decoded`` and ``answer_bytes`` are (N,) counts per example."""
    whole = teacher_forced if decoded is None else decoded  # either: right in full alike
    answers = answer_bytes.sum().item()
    scores = {
        "accuracy": None if decoded is None else decoded.sum().item() / answers,
        "sequence_accuracy": (whole == answer_bytes).double().mean().item(),
        "teacher_forced_accuracy": teacher_forced.sum().item() / answers,
    }
    if depth_percent is not None:
        by_depth = []
        for depth in depth_percent.unique().tolist():
            at = depth_percent == depth  # (N,)
            at_depth = None if decoded is None else decoded[at]
            scores_at = answer_scores(teacher_forced[at], at_depth, answer_bytes[at])
            by_depth.append({"depth_percent": depth, **scores_at, "examples": int(at.sum())})
        scores["accuracy_by_depth"] = by_depth
    return scores


@torch.inference_mode()
def evaluate_task_length(
    model: Transformer,
    task: Task,
    length: int,
    batch_size: int | None = None,
    precision: str = "fp32",
    positions: RandomPositions | None = None,
    decode: str = "greedy",
) -> dict[str, Any]:
    """One results.json eval record of a task at ``length`` (a window's tokens, or an
    algorithmic task's problem length; ``window``: the inputs of its longest example): the
    answer bytes' ppl and bits_per_byte, and their ``answer_scores``, of the model's own
    answers for ``decode`` greedy (also under teacher forcing, which teacher_forced alone
    scores), with forward passes in ``precision``, each example at its randomized
    ``positions`` (None: 0..L-1)."""
    model.eval()
    reason = task.unscorable(length)
    examples = task.examples(length) if reason is None else None
    window = length if examples is None else examples.window()
    scaling = model.encoding.scaling_record(window)
    reason = reason or beyond_max_length(model, window, positions)
    if reason is not None:
        return {**unsupported(length, None, reason, scaling, positions), **NOT_SCORED}
    n = len(examples.tokens)
    device = next(model.parameters()).device
    batch_size = min(batch_size or max(1, TOKENS_PER_BATCH // window), n)
    batch_size, shortfall = fitting_batch_size(
        model, window, batch_size, device, consecutive=positions is None
    )
    if shortfall is not None:
        return {**unsupported(length, None, shortfall, scaling, positions), **NOT_SCORED}
    nll, teacher_forced, decoded = task_predictions(
        model, examples, batch_size, device, precision, positions, decode
    )
    answer_bytes = examples.answer.sum(1)  # (N,)
    mean_nll = nll / answer_bytes.sum().item()
    return {
        "length": length,
        "window": window,
        "stride": None,
        "ppl": math.exp(mean_nll),
        "bits_per_byte": mean_nll / math.log(2),
        "word_ppl": None,  # answers are a few bytes, not text
        "tokens": answer_bytes.sum().item(),
        "bytes": answer_bytes.sum().item(),
        "words": None,
        "status": "ok",
        "reason": None,
        "precision": precision,
        **scaling,
        **positions_record(positions, n),
        "examples": n,
        "decode": decode,
        **answer_scores(teacher_forced, decoded, answer_bytes, examples.depth_percent),
    }


def task_predictions(
    model: Transformer,
    examples: Examples,
    batch_size: int,
    device: torch.device,
    precision: str = "fp32",
    positions: RandomPositions | None = None,
    decode: str = "greedy",
) -> tuple[float, torch.Tensor, torch.Tensor | None]:
    """The answer bytes' summed NLL (nats) under teacher forcing and, per example, how many of
    its answer bytes are the model's argmax given the true prefix and (``decode`` greedy; None
    for teacher_forced) in its own greedy decode, each example at its ``positions`` (None:
    0..L-1): (float, (N,) int64, (N,) int64 or None)."""
    nll, correct, decoded_correct = 0.0, [], []
    with tqdm(total=len(examples.tokens), desc="eval task", unit="example", leave=False) as bar:
        for first, inputs, targets, answer in zip(
            range(0, len(examples.tokens), batch_size),
            examples.inputs().split(batch_size),
            examples.targets().split(batch_size),
            examples.answer.split(batch_size),
            strict=True,
        ):
            inputs, targets = inputs.to(device), targets.to(device)  # (B, T)
            answer = answer.to(device)  # (B, T)
            at = None
            if positions is not None:  # keyed by the examples' indices
                keys = range(first, first + len(inputs))
                at = positions.of_windows(inputs.shape[1], keys).to(device)  # (B, T)
            with autocast(precision, device):
                logits = model(inputs, at).float()  # (B, T, vocab)
            nll_bt = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # (B, T)
            nll += nll_bt.double().sum().item()  # IGNORE targets add 0
            hits = logits.argmax(-1) == targets  # (B, T): IGNORE targets never match
            correct.append(hits.sum(1).cpu())
            if decode == "greedy":
                # Answers are autoregressive: the input after an answer byte is that byte.
                assert (inputs[:, 1:] == targets[:, :-1])[answer[:, :-1]].all()
                with autocast(precision, device):
                    predictions = greedy_decode(model, inputs, answer, at)  # (B, T)
                decoded_correct.append((predictions == targets).sum(1).cpu())
            bar.update(len(inputs))
    return nll, torch.cat(correct), torch.cat(decoded_correct) if decoded_correct else None


def evaluate_task(
    model: Transformer,
    task: Task,
    lengths: Sequence[int],
    batch_size: int | None = None,
    precision: str = "fp32",
    positions: RandomPositions | None = None,
    decode: str = "greedy",
) -> list[dict[str, Any]]:
    """Evaluate ``model`` on ``task``'s examples at each length, in ``precision``, at
    ``positions`` (None: 0..L-1), its answers scored as ``decode`` says (greedy |
    teacher_forced); results.json eval records."""
    decodes = [d.value for d in EvalDecode]
    if decode not in decodes:
        raise PosbenchError(f"decode must be one of {', '.join(decodes)} (got {decode!r})")
    return [
        evaluate_task_length(model, task, n, batch_size, precision, positions, decode)
        for n in lengths
    ]


def evaluate_data(
    model: Transformer,
    data: Corpus | Task,
    lengths: Sequence[int],
    stride: int | None = None,
    batch_size: int | None = None,
    max_tokens: int | None = None,
    train_seq_len: int | None = None,
    precision: str = "fp32",
    positions: RandomPositions | None = None,
    decode: str = "greedy",
) -> list[dict[str, Any]]:
    """``evaluate`` on a corpus's validation split, ``evaluate_task`` on a task (its answers
    scored as ``decode`` says), at ``positions`` (None: 0..L-1)."""
    if isinstance(data, Corpus):
        return evaluate(
            model,
            data.val,
            lengths,
            stride,
            batch_size,
            max_tokens,
            train_seq_len,
            precision,
            data.val_documents,
            positions,
            data.val_token_bytes,
            data.val_word_starts,
        )
    if stride is not None:
        raise PosbenchError(
            f"data={data.config.source} scores whole prompts: a stride applies to corpora only; "
            "drop --stride / eval.stride"
        )
    return evaluate_task(model, data, lengths, batch_size, precision, positions, decode)


def evaluate_run(
    run_dir: str | Path,
    lengths: Sequence[int],
    stride: int | None = None,
    batch_size: int | None = None,
    device: str = "auto",
    max_tokens: int | None = None,
    encoding_overrides: Mapping[str, Any] | None = None,
    precision: str | None = None,
    positions: str | None = None,
    decode: str | None = None,
) -> list[dict[str, Any]]:
    """Evaluate a trained run on its own validation split; returns results.json eval records.

    ``max_tokens``, ``precision``, ``positions`` (auto | consecutive | random) and ``decode``
    (greedy | teacher_forced) default to the run's ``eval.max_tokens``, ``eval.precision``,
    ``eval.positions`` and ``eval.decode`` (greedy for runs from before it: their records are
    re-scored the new way), so the numbers are comparable with the ones measured at the end of
    training. ``encoding_overrides`` are merged
    over the
    run's encoding config before its weights are loaded (e.g. ``rope_scaling_overrides``).
    """
    model, cfg = load_run(run_dir, resolve_device(device), encoding_overrides)
    data = load_data(cfg.data)
    if max_tokens is None:
        max_tokens = cfg.eval.max_tokens
    if precision is None:  # runs from before eval.precision existed evaluated in fp32
        precision = OmegaConf.select(cfg, "eval.precision", default="fp32")
    if decode is None:
        decode = choice(OmegaConf.select(cfg, "eval.decode", default="greedy"))
    return evaluate_data(
        model,
        data,
        lengths,
        stride,
        batch_size,
        max_tokens,
        cfg.train.seq_len,
        precision,
        eval_positions(cfg, positions),
        decode,
    )


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
