"""Accuracy of a trained model on a task's answers at any length (``evaluate_task``).

Tasks (``data=passkey``, ``copy``, ``recall``, the algorithmic tasks) are scored on their
answer tokens only: at each length, ``data.val_examples`` prompts of exactly that length (an
algorithmic task's: problems of that size), by the model's own answer, written as the task asks
for it (``answer_mode``, posbench/data/task.py). Under ``placeholders`` one forward pass writes
every answer token at its blank and none is an input: that argmax is the model's answer, scored
per token up to the answer's end (Ruoss et al.'s measure), and there is nothing to decode
(``decode``: null). Autoregressive answers are decoded greedily (``eval.decode=greedy``, the
default; decode.py): the input after an answer byte is the model's prediction of it, not
the true byte; ``teacher_forced`` does not decode. Their records add ``answer_mode``,
``decode`` ("greedy", "teacher_forced" or null), ``accuracy`` (answer tokens right in the
model's own answer; null under teacher_forced), ``sequence_accuracy`` (examples whose answer is
right in full: the same under greedy decoding and teacher forcing, as a decode is right in full
exactly when every argmax given the true prefix is), ``teacher_forced_accuracy``
(autoregressive answers: the share of answer bytes that are the argmax given the true bytes
before them, where a rule that repeats the previous answer byte scores high; null at
placeholders), the prompt-blind baselines (posbench/data/baselines.py: ``chance_accuracy``,
``constant_answer_accuracy`` at the record's length and, for autoregressive answers,
``prefix_rule_accuracy``, the bound of teacher-forced accuracy) and, for passkey and the needle
tasks, ``accuracy_by_depth`` (the same per needle depth; flip_flop: ``accuracy_by_p_ignore``,
per test distribution, scored under teacher forcing as its paper does: the record's
``protocol_decode``, and its ``accuracy`` that teacher-forced share);
``ppl`` and ``bits_per_byte`` are those of the answer tokens in the one forward pass
(autoregressive answers: under teacher forcing).

Records share the corpus records' fields (perplexity.py) and add those above.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from posbench.config import EvalDecode
from posbench.data import IGNORE, AnswerMode, Examples, Task
from posbench.data.baselines import constant_answer_accuracy, prefix_rule_accuracy
from posbench.errors import PosbenchError
from posbench.evaluation.decode import greedy_decode
from posbench.evaluation.memory import fitting_batch_size
from posbench.evaluation.perplexity import (
    TOKENS_PER_BATCH,
    beyond_max_length,
    perplexity,
    unsupported,
)
from posbench.evaluation.positions import RandomPositions, positions_record
from posbench.model import Transformer
from posbench.model.random_positions import PositionDraw, row_lengths
from posbench.system.precision import autocast

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


# The breakdowns of a record by a property of its examples (``Examples``' field of that name):
# the record's key for each.
BREAKDOWNS = {"depth_percent": "accuracy_by_depth", "p_ignore": "accuracy_by_p_ignore"}


def answer_scores(
    answered: torch.Tensor | None,
    teacher_forced: torch.Tensor | None,
    answer_tokens: torch.Tensor,
    **groups: torch.Tensor | None,
) -> dict[str, Any]:
    """``accuracy`` (answer tokens right in the model's own answer / answer tokens; None when
    ``answered`` is), ``sequence_accuracy`` (examples with every answer token right /
    examples), ``teacher_forced_accuracy`` (answer tokens right given the true prefix / answer
    tokens; None when ``teacher_forced`` is) and, for each of ``groups`` (a ``BREAKDOWNS``
    key: ``depth_percent``, the needle's depth; ``p_ignore``, flip_flop's distribution) given,
    its record key (``accuracy_by_depth``, ...): the same three per value. ``answered`` (the
    greedy decode's or, at placeholders, the one forward pass's), ``teacher_forced``,
    ``answer_tokens`` and ``groups`` are (N,), one per example."""
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
    for key, values in groups.items():
        if values is None:
            continue
        by_value = []
        for value in values.unique().tolist():
            at = values == value  # (N,)
            counts = [None if c is None else c[at] for c in (answered, teacher_forced)]
            scores_at = answer_scores(*counts, answer_tokens[at])
            by_value.append({key: value, **scores_at, "examples": int(at.sum())})
        scores[BREAKDOWNS[key]] = by_value
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
    decoding = (task.protocol_decode or decode) if autoregressive else None
    nll, one_pass, decoded = task_predictions(
        model, examples, batch_size, device, precision, positions, decoding == "greedy"
    )
    # At placeholders the one forward pass is the model's answer; else it is teacher-forced.
    answered, teacher_forced = (decoded, one_pass) if autoregressive else (one_pass, None)
    if task.protocol_decode == "teacher_forced":  # the paper's own answer: given the true prefix
        answered = one_pass
    answer_tokens = examples.answer.sum(1)  # (N,)
    mean_nll = nll / answer_tokens.sum().item()
    return {
        "length": length,
        "window": window,
        "stride": None,
        "ppl": perplexity(mean_nll),
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
        **({"protocol_decode": task.protocol_decode} if task.protocol_decode else {}),
        **answer_scores(
            answered,
            teacher_forced,
            answer_tokens,
            **{key: getattr(examples, key) for key in BREAKDOWNS},
        ),
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
    answers (decode.py), each example at its ``positions`` (None: 0..L-1), the same
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
