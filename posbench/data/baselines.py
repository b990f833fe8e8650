"""Prompt-blind baselines: what rules that never read the prompt's content score on a task.

A task's headline accuracy is per answer token (posbench/evaluation/task_accuracy.py). A model
can score well above chance on it without reading the prompt when answers are skewed, so every
task record carries the bounds of such models beside its accuracy:

* The constant answer at a length: at each answer index, the token most common there among the
  length's scored problems. A model that sees only the length (and, under placeholders, the
  blanks) writes one fixed answer per length, and no fixed answer scores more per token than
  this one.
* The prefix rules, for answers scored under teacher forcing, where answer token k is predicted
  from the true tokens 0..k-1: ``repeat_previous`` (token k - 1) and ``copy_back`` (token
  k - n, n the problem length). They read nothing of the prompt, yet on a sorted answer
  (bucket_sort) or one written twice (duplicate_string) they score far above the constant.
  Decoding from their own outputs instead, they are a fixed answer again.

The functions take an example's targets and scored mask, (N, T) as ``Examples`` holds them:
answer index i of an example is its i-th scored target.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def answer_table(targets: torch.Tensor, scored: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each example's scored targets in order, left-aligned: int64 (N, K), K the longest
    answer (0 past an answer's end), and bool (N, K), where an answer has a token."""
    index = scored.long().cumsum(1) - 1  # (N, T): the answer index of each scored target
    rows = torch.arange(len(scored))[:, None].expand_as(scored)  # (N, T)
    width = int(scored.sum(1).max())
    table = torch.zeros(len(scored), width, dtype=torch.long)
    present = torch.zeros(len(scored), width, dtype=torch.bool)
    table[rows[scored], index[scored]] = targets[scored].long()
    present[rows[scored], index[scored]] = True
    return table, present


def constant_answer(tables: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """The most common token at each answer index over ``tables`` (``answer_table``s), the
    lowest of a tie: int64 (K,), K the longest answer."""
    width = max(table.shape[1] for table, _ in tables)
    vocab = 1 + max(int(table.max()) for table, _ in tables)
    counts = torch.zeros(width, vocab, dtype=torch.long)
    for table, present in tables:
        index = torch.arange(table.shape[1]).expand_as(table)  # (N, K)
        counts.index_put_((index[present], table[present]), torch.tensor(1), accumulate=True)
    return counts.argmax(1)  # torch.argmax returns the first of equal maxima


def accuracy(predictions: torch.Tensor, table: torch.Tensor, present: torch.Tensor) -> float:
    """The fraction of the answer tokens ``present`` in ``table`` (N, K) that ``predictions``
    ((N, K), or (K,) for every example alike) get right."""
    return (predictions == table)[present].double().mean().item()


def constant_answer_accuracy(answers: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """The accuracy per answer token of the constant answer of ``answers`` (the (targets,
    scored) of each length's examples), scored length by length and averaged."""
    tables = [answer_table(targets, scored) for targets, scored in answers]
    constant = constant_answer(tables)
    scores = [accuracy(constant[: table.shape[1]], table, present) for table, present in tables]
    return sum(scores) / len(scores)


# A prefix rule: the prediction of every answer token from the (true or its own) answer tokens
# before it, (N, K) -> (N, K), with the constant answer (K,) where it has nothing to read, at
# problem length n.
PrefixRule = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


def repeat_previous(answers: torch.Tensor, constant: torch.Tensor, length: int) -> torch.Tensor:
    """Token k is token k - 1; token 0 the constant answer's."""
    predictions = answers.roll(1, dims=1)  # (N, K)
    predictions[:, 0] = constant[0]
    return predictions


def copy_back(answers: torch.Tensor, constant: torch.Tensor, length: int) -> torch.Tensor:
    """Token k is token k - n (n = ``length``, the problem length); the first n are the
    constant answer's."""
    predictions = constant[: answers.shape[1]].expand_as(answers).clone()  # (N, K)
    predictions[:, length:] = answers[:, :-length]
    return predictions


PREFIX_RULES: dict[str, PrefixRule] = {
    "repeat_previous": repeat_previous,
    "copy_back": copy_back,
}


def prefix_rule_accuracy(targets: torch.Tensor, scored: torch.Tensor, length: int) -> float:
    """The better accuracy per answer token of the ``PREFIX_RULES`` under teacher forcing (each
    token predicted from the true ones before it) on examples of problem length ``length``,
    their constant answer that of these examples."""
    table, present = answer_table(targets, scored)
    constant = constant_answer([(table, present)])
    return max(
        accuracy(rule(table, constant, length), table, present) for rule in PREFIX_RULES.values()
    )
