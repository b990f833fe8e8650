"""What an algorithmic sweep's Table 1 adds to a mean over seeds: the best seed and the share of
seeds that succeed, Kazemnejad et al. 2023's mean reciprocal rank of the encodings across
tasks, and the prompt-blind baselines over the lengths a score averages. Plain numbers in and
out (tables.py prints them)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

# ``posbench report --success-threshold``: a seed succeeds on a task when its score there is
# above this. 0.9: near-perfect on every task, where chance is at most 0.5 per answer byte.
DEFAULT_SUCCESS_THRESHOLD = 0.9
# Per-length baselines an evaluation record may hold (records written before posbench recorded
# them hold none): a uniform guess, the best answer that reads nothing of the prompt but its
# length, and, for answers scored autoregressively, the best rule that reads only the answer's
# own earlier bytes (as teacher forcing gives them).
BASELINES = ("chance_accuracy", "constant_answer_accuracy", "prefix_rule_accuracy")


def baselines_over(
    records: Sequence[Mapping[str, Any]], lengths: Sequence[int]
) -> dict[str, float | None]:
    """Each of BASELINES averaged over ``lengths`` as a run's summary averages its scores: at
    each length the mean of the records there that hold it (the runs of a group score the same
    problems, so they agree), then the mean over the lengths. None where some length
    has no record holding it: a mean over fewer lengths than the score's would not compare."""
    means: dict[str, float | None] = {}
    for name in BASELINES:
        per_length = [
            [r[name] for r in records if r["length"] == n and r.get(name) is not None]
            for n in lengths
        ]
        complete = bool(lengths) and all(per_length)
        means[name] = (
            statistics.fmean(statistics.fmean(v) for v in per_length) if complete else None
        )
    return means


def success_rate(values: Sequence[float], threshold: float) -> float | None:
    """The share of ``values`` (one score per seed) above ``threshold``; None without any."""
    if not values:
        return None
    return sum(value > threshold for value in values) / len(values)


def reciprocal_ranks(scores: Mapping[str, float | None]) -> dict[str, float]:
    """1 / rank of each name with a score, the highest score ranked 1. Ties share the best rank
    of the tie (competition ranking: 0.9, 0.9, 0.5 rank 1, 1, 3), so a tie costs neither."""
    scored = [score for score in scores.values() if score is not None]
    return {
        name: 1 / (1 + sum(other > score for other in scored))
        for name, score in scores.items()
        if score is not None
    }


def mean_reciprocal_ranks(tasks: Sequence[Mapping[str, float | None]]) -> dict[str, float]:
    """Kazemnejad et al.'s mean reciprocal rank of each name over ``tasks`` (each task: a name's
    score there, None or absent where it has none). A name without a score on a task (not run
    there, or at a length it cannot represent) counts 0 there: every name is averaged over all
    the tasks."""
    names = list(dict.fromkeys(name for scores in tasks for name in scores))
    ranks = [reciprocal_ranks(scores) for scores in tasks]
    return {name: statistics.fmean(r.get(name, 0.0) for r in ranks) for name in names}


def mean_reciprocal_rank_table(
    tasks: Mapping[str, Sequence[Mapping[str, float | None]]],
) -> list[str]:
    """Markdown: one line per name, one column per measure (``tasks``: measure -> per task, each
    name's score), the mean reciprocal rank over the tasks by that measure and on how many tasks
    the name has a score; lines by the first measure's rank, best first."""
    by_measure = {what: mean_reciprocal_ranks(per_task) for what, per_task in tasks.items()}
    first = next(iter(tasks))
    scored = {
        name: sum(scores.get(name) is not None for scores in tasks[first])
        for name in by_measure[first]
    }
    n_tasks = len(tasks[first])
    lines = [
        f"Mean reciprocal rank across the {n_tasks} tasks (Kazemnejad et al. 2023): on each "
        "task the encodings ranked by their mean over seeds (1 = best; tied means share the "
        "best rank of the tie), 1 / rank averaged over every task, 0 on a task where an "
        "encoding has no score:",
        "",
        "| encoding | tasks scored | " + " | ".join(f"MRR, {what}" for what in tasks) + " |",
        "| --- | --- |" + " --- |" * len(tasks),
    ]
    for name in sorted(by_measure[first], key=lambda n: -by_measure[first][n]):
        mrrs = " | ".join(f"{by_measure[what][name]:.2f}" for what in tasks)
        lines.append(f"| {name} | {scored[name]} | {mrrs} |")
    return lines
