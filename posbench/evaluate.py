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

Tasks (``data=passkey``, ``copy``, ``recall``, the algorithmic tasks) are scored on their
answer tokens only: at each length, ``data.val_examples`` prompts of exactly that length (an
algorithmic task's: problems of that size), by the model's own answer, written as the task asks
for it (``answer_mode``, posbench/data/task.py). Under ``placeholders`` one forward pass writes
every answer token at its blank and none is an input: that argmax is the model's answer, scored
per token up to the answer's end (Ruoss et al.'s measure), and there is nothing to decode
(``decode``: null). Autoregressive answers are decoded greedily (``eval.decode=greedy``, the
default; posbench/decode.py): the input after an answer byte is the model's prediction of it,
not the true byte; ``teacher_forced`` does not decode. Their records add ``answer_mode``,
``decode`` ("greedy", "teacher_forced" or null), ``accuracy`` (answer tokens right in the
model's own answer; null under teacher_forced), ``sequence_accuracy`` (examples whose answer is
right in full: the same under greedy decoding and teacher forcing, as a decode is right in full
exactly when every argmax given the true prefix is), ``teacher_forced_accuracy``
(autoregressive answers: the share of answer bytes that are the argmax given the true bytes
before them, where a rule that repeats the previous answer byte scores high; null at
placeholders), the prompt-blind baselines (posbench/data/baselines.py: ``chance_accuracy``,
``constant_answer_accuracy`` at the record's length and, for autoregressive answers,
``prefix_rule_accuracy``, the bound of teacher-forced accuracy) and, for passkey,
``accuracy_by_depth`` (the same per needle depth); ``ppl`` and ``bits_per_byte`` are those of
the answer tokens in the one forward pass (autoregressive answers: under teacher forcing).

Randomized positions (a run trained with ``train.random_positions=N``, Ruoss et al. 2023):
evaluation and validation draw from the distribution training drew from
(posbench/random_positions.py): each window, or task example for its own length (up to its
last answer byte), at a sorted random subset of [0, N), a fresh one in every layer by default
(``train.random_positions_per_layer``), or, for a bias of the distance alone (ALiBi, T5,
KERPLE, Sandwich; ``train.random_positions_mode``), at 0..L-1 with its distances relabelled by
a sorted subset of [1, N), as the reference (google-deepmind/randomized_positional_encodings)
draws them; not at 0..L-1 (``eval.positions``: ``auto`` does so for such runs;
``consecutive`` evaluates at 0..L-1 instead, to study what the model does without them). The
draws come from a generator seeded by the data's seed, the example's length and the window (or
example), layer by layer, so every run compared on the same data sees the same draws; a length
above N is unsupported. Records say which (``positions``: "random" or "consecutive",
``random_positions``: N, ``random_positions_mode``: "positions" or "distances",
``random_positions_per_layer``, ``position_draws``: how many windows drew).

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
    IGNORE,
    AnswerMode,
    Bytes,
    Corpus,
    Examples,
    Offsets,
    Task,
    byte_is_whitespace,
    gather_windows,
    load_data,
)
from posbench.data.baselines import constant_answer_accuracy, prefix_rule_accuracy
from posbench.decode import greedy_decode
from posbench.errors import PosbenchError
from posbench.memory import fitting_batch_size
from posbench.model import Transformer
from posbench.precision import autocast
from posbench.random_positions import PositionDraw, PositionSampler, position_sampler, row_lengths
from posbench.runs import load_run

TOKENS_PER_BATCH = 65536  # default eval batch: about this many tokens per forward pass
BUCKETS_PER_TRAIN_LENGTH = 8  # equal position buckets inside the training length
BUCKETS_PER_OCTAVE = 4  # equal position buckets in each doubling beyond it (fewer if needed)
MAX_POSITION_BUCKETS = 64


# The record fields of an evaluation at positions 0..L-1.
CONSECUTIVE = {
    "positions": "consecutive",
    "random_positions": None,
    "random_positions_mode": None,
    "random_positions_per_layer": None,
    "position_draws": None,
}


@dataclass(frozen=True)
class RandomPositions:
    """Randomized positions at evaluation: each window (or task example) drawn as training
    draws it (``sampler``, posbench/random_positions.py: for its own length, per layer,
    positions or distances), from a generator seeded by ``seed`` (the data's), the example's
    length and its ``key`` (a window's start in the split, or a task example's index): the same
    for every run on the same data, and independent of batch sizes and of which other lengths
    or windows are evaluated."""

    sampler: PositionSampler
    seed: int

    @property
    def n_positions(self) -> int:
        return self.sampler.n_positions

    @property
    def consecutive(self) -> bool:
        """Whether the tokens stay at 0..L-1 (randomized distances), for the memory estimate."""
        return self.sampler.mode == "distances"

    def of_windows(
        self, width: int, keys: Sequence[int], lengths: torch.Tensor | None = None
    ) -> PositionDraw:
        """The draws of the windows ``keys`` of ``lengths`` (B,) tokens (None: every one
        ``width``), padded to ``width``: (B, width) tensors, or (n_layer, B, width) per layer."""
        lengths = torch.full((len(keys),), width) if lengths is None else lengths
        draws = []
        for key, length in zip(keys, lengths.tolist(), strict=True):
            state = np.random.SeedSequence([self.seed, length, key]).generate_state(1, np.uint64)
            generator = torch.Generator().manual_seed(int(state[0]))
            draws.append(self.sampler.draw(torch.tensor([length]), width, generator))
        return PositionDraw.cat(draws)

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
        return {"positions": "random", **self.sampler.record(), "position_draws": draws}


def positions_record(positions: RandomPositions | None, draws: int) -> dict[str, Any]:
    """A record's ``positions``, ``random_positions`` and ``position_draws`` fields."""
    return CONSECUTIVE if positions is None else positions.record(draws)


def eval_positions(cfg: DictConfig, setting: str | None = None) -> RandomPositions | None:
    """Where the run configured by ``cfg`` is evaluated: at randomized positions (for
    ``setting`` random, or auto in a run trained with train.random_positions) or at 0..L-1
    (None). ``setting`` None: the run's ``eval.positions`` (auto for runs from before it)."""
    setting = setting or choice(OmegaConf.select(cfg, "eval.positions", default="auto"))
    sampler = position_sampler(cfg)
    if setting == "consecutive" or (setting == "auto" and sampler is None):
        return None
    if sampler is None:
        raise PosbenchError(
            "eval.positions=random draws from [0, train.random_positions), and this run was "
            "trained without train.random_positions; use eval.positions=auto or consecutive"
        )
    return RandomPositions(sampler, OmegaConf.select(cfg, "data.seed", default=0))


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
    has_words: bool = True,
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
    ``val_word_starts``; None: ``tokens`` are bytes, which count themselves). Without
    ``has_words`` (bytes that are not text: the synthetic corpus) ``word_ppl`` and ``words``
    are None: whitespace bytes there delimit no words. ``tokens`` (a
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
            model,
            length,
            batch_size,
            device,
            consecutive=positions is None or positions.consecutive,
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
            at = PositionDraw() if positions is None else positions.of_windows(length, starts)
            at = at.to(device)
            with autocast(precision, device):
                # (B, T) float32, without the (B, T, vocab) logits where they are large
                nll = model(
                    rows[:, :-1],
                    at.positions,
                    targets=rows[:, 1:],
                    reduction="none",
                    distances=at.distances,
                )
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
        "word_ppl": math.exp(total_nll / n_words) if n_words and has_words else None,
        "tokens": scored,
        "bytes": n_bytes,
        "words": n_words if has_words else None,
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
    has_words: bool = True,
) -> list[dict[str, Any]]:
    """Evaluate ``model`` on ``tokens`` (a tensor or a numpy array: bytes, or a tokenizer's
    ids with each one's ``token_bytes`` and ``word_starts``) at each length, in ``precision``,
    at ``positions`` (None: 0..L-1); ``has_words``: whether the bytes are text, with words
    (``word_ppl``).

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
            has_words,
        )
        for n in lengths
    ]


# a task length not measured
NOT_SCORED = dict.fromkeys(["decode", "accuracy", "sequence_accuracy", "teacher_forced_accuracy"])


def baselines(task: Task, examples: Examples | None, length: int) -> dict[str, Any]:
    """A task record's prompt-blind baselines at ``length`` (posbench/data/baselines.py):
    ``chance_accuracy``, ``constant_answer_accuracy`` (the best fixed answer at this length)
    and, for autoregressive answers, ``prefix_rule_accuracy`` (the better of the prefix rules
    under teacher forcing); None where ``examples`` could not be drawn."""
    fields: dict[str, Any] = {"chance_accuracy": task.chance_accuracy()}
    answers = None if examples is None else (examples.targets(), examples.answer)
    fields["constant_answer_accuracy"] = answers and constant_answer_accuracy([answers])
    if task.answer_mode is AnswerMode.autoregressive:  # no answer token is an input otherwise
        fields["prefix_rule_accuracy"] = answers and prefix_rule_accuracy(*answers, length)
    return fields


def answer_scores(
    answered: torch.Tensor | None,
    teacher_forced: torch.Tensor | None,
    answer_tokens: torch.Tensor,
    depth_percent: torch.Tensor | None = None,
) -> dict[str, Any]:
    """``accuracy`` (answer tokens right in the model's own answer / answer tokens; None when
    ``answered`` is), ``sequence_accuracy`` (examples with every answer token right /
    examples), ``teacher_forced_accuracy`` (answer tokens right given the true prefix / answer
    tokens; None when ``teacher_forced`` is) and, with ``depth_percent``,
    ``accuracy_by_depth``: the same three per needle depth. ``answered`` (the greedy decode's
    or, at placeholders, the one forward pass's), ``teacher_forced`` and ``answer_tokens`` are
    (N,) counts per example."""
    # Either is right in full alike: a decode is exactly when every argmax given the true
    # prefix is.
    whole = teacher_forced if answered is None else answered
    assert whole is not None, "answers scored one way at least"
    answers = answer_tokens.sum().item()
    scores = {
        "accuracy": None if answered is None else answered.sum().item() / answers,
        "sequence_accuracy": (whole == answer_tokens).double().mean().item(),
        "teacher_forced_accuracy": (
            None if teacher_forced is None else teacher_forced.sum().item() / answers
        ),
    }
    if depth_percent is not None:
        by_depth = []
        for depth in depth_percent.unique().tolist():
            at = depth_percent == depth  # (N,)
            counts = [None if c is None else c[at] for c in (answered, teacher_forced)]
            scores_at = answer_scores(*counts, answer_tokens[at])
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
    answer tokens' ppl and bits_per_byte and their ``answer_scores``, with forward passes in
    ``precision``, each example at its randomized ``positions`` (None: 0..L-1), and the
    record's prompt-blind ``baselines``. The model's own answer is, under placeholders, one
    forward pass's argmax (``decode`` null: nothing to decode) and, for autoregressive answers,
    its greedy decode (``decode`` greedy; teacher_forced scores the argmax given the true
    prefix alone, which greedy scores too)."""
    model.eval()
    reason = task.unscorable(length)
    examples = task.examples(length) if reason is None else None
    window = length if examples is None else examples.window()
    scaling = model.encoding.scaling_record(window)
    reason = reason or beyond_max_length(model, window, positions)
    about = {"answer_mode": task.answer_mode.value, **baselines(task, examples, length)}
    if reason is not None:
        return {**unsupported(length, None, reason, scaling, positions), **NOT_SCORED, **about}
    n = len(examples.answer)
    device = next(model.parameters()).device
    batch_size = min(batch_size or max(1, TOKENS_PER_BATCH // window), n)
    batch_size, shortfall = fitting_batch_size(
        model, window, batch_size, device, consecutive=positions is None or positions.consecutive
    )
    if shortfall is not None:
        return {**unsupported(length, None, shortfall, scaling, positions), **NOT_SCORED, **about}
    autoregressive = task.answer_mode is AnswerMode.autoregressive
    decoding = decode if autoregressive else None
    nll, one_pass, decoded = task_predictions(
        model, examples, batch_size, device, precision, positions, decoding == "greedy"
    )
    # At placeholders the one forward pass is the model's answer; else it is teacher-forced.
    answered, teacher_forced = (decoded, one_pass) if autoregressive else (one_pass, None)
    answer_tokens = examples.answer.sum(1)  # (N,)
    mean_nll = nll / answer_tokens.sum().item()
    return {
        "length": length,
        "window": window,
        "stride": None,
        "ppl": math.exp(mean_nll),
        "bits_per_byte": mean_nll / math.log(2),
        "word_ppl": None,  # answers are a few bytes, not text
        "tokens": answer_tokens.sum().item(),
        "bytes": answer_tokens.sum().item(),
        "words": None,
        "status": "ok",
        "reason": None,
        "precision": precision,
        **scaling,
        **positions_record(positions, n),
        "examples": n,
        "decode": decoding,
        **answer_scores(answered, teacher_forced, answer_tokens, examples.depth_percent),
        **about,
    }


def task_predictions(
    model: Transformer,
    examples: Examples,
    batch_size: int,
    device: torch.device,
    precision: str = "fp32",
    positions: RandomPositions | None = None,
    greedy: bool = False,
) -> tuple[float, torch.Tensor, torch.Tensor | None]:
    """The scored answer tokens' summed NLL (nats) and, per example, how many of them are the
    model's argmax in one forward pass over its inputs (autoregressive answers: given the true
    prefix) and, if ``greedy`` (None otherwise), in its own greedy decode of its autoregressive
    answers (posbench/decode.py), each example at its ``positions`` (None: 0..L-1), the same
    draw both ways: (float, (N,) int64, (N,) int64 or None)."""
    nll, correct, decoded_correct = 0.0, [], []
    n = len(examples.answer)
    with tqdm(total=n, desc="eval task", unit="example", leave=False) as bar:
        for first, inputs, targets, scored in zip(
            range(0, n, batch_size),
            examples.inputs().split(batch_size),
            examples.targets().split(batch_size),
            examples.answer.split(batch_size),
            strict=True,
        ):
            at = PositionDraw()
            if positions is not None:  # keyed by the examples' indices, each for its length
                keys = range(first, first + len(inputs))
                at = positions.of_windows(inputs.shape[1], keys, row_lengths(targets))
            inputs, targets, scored = inputs.to(device), targets.to(device), scored.to(device)
            at = at.to(device)  # (B, T) tensors, or (n_layer, B, T)
            with autocast(precision, device):
                # (B, T, V); a bidirectional model hides the padding after each row's end
                logits = model(
                    inputs, at.positions, distances=at.distances, lengths=row_lengths(targets)
                ).float()
            nll_bt = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # (B, T)
            # Trained but unscored targets (the padding after a terminator) count for neither.
            nll += nll_bt.double().masked_fill(~scored, 0.0).sum().item()
            hits = (logits.argmax(-1) == targets) & scored  # (B, T)
            correct.append(hits.sum(1).cpu())
            if greedy:
                # Answers are autoregressive: the input after an answer byte is that byte (where
                # the row goes on: padding follows its last).
                goes_on = scored[:, :-1] & (targets[:, 1:] != IGNORE)  # (B, T - 1)
                assert (inputs[:, 1:] == targets[:, :-1])[goes_on].all()
                with autocast(precision, device):
                    predictions = greedy_decode(model, inputs, scored, *at.tensors)  # (B, T)
                decoded_correct.append(((predictions == targets) & scored).sum(1).cpu())
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
            data.has_words,
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


ROPE_SCALING_NEEDS_ROPE = "RoPE scaling needs a run trained with encoding=rope"


def rope_scaling_overrides(
    cfg: DictConfig, method: str, factor: float | None = None
) -> dict[str, Any]:
    """Encoding overrides that evaluate the rope run configured by ``cfg`` with an eval-time
    scaling ``method`` (posbench.encodings.rope.SCALING_METHODS) and ``factor`` (None: from each
    length). The original length is the run's training length, never the evaluation length."""
    if cfg.encoding.name != "rope":
        raise PosbenchError(f"{ROPE_SCALING_NEEDS_ROPE}; this run used {cfg.encoding.name!r}")
    trained = OmegaConf.select(cfg, "encoding.scaling.original_length") or cfg.train.seq_len
    return {"scaling": {"method": method, "factor": factor, "original_length": trained}}
