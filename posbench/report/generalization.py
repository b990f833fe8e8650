"""An algorithmic sweep's summary tables, which open its report: Ruoss et al.'s Table 1, one
line per task and one column per encoding, of the runs' length_generalization summaries as
mean ± std, max and success rate over seeds, beside the task's prompt-blind baselines; then
Kazemnejad et al.'s mean reciprocal rank of the encodings across the tasks (aggregate.py
computes; this module prints, and gives report.json the same numbers)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from posbench.report.aggregate import (
    DEFAULT_SUCCESS_THRESHOLD,
    mean_reciprocal_rank_table,
    mean_reciprocal_ranks,
    success_rate,
)
from posbench.report.cells import Stat
from posbench.report.groups import Group, Report
from posbench.report.text import best_shown, stat_text

# The summaries of a run on an algorithmic task (runs.with_length_generalization), by the Row
# attribute that holds them.
GENERALIZATION = {
    "generalization": "mean sequence accuracy (whole answer right)",
    "generalization_accuracy": "mean accuracy per answer byte",
}


# What a Table 1 cell shows of a row's summaries, one per seed (generalization_table's part).
SEED_AGGREGATES = {
    "mean": "mean ± std over seeds",
    "max": "max over seeds (the best seed)",
    "success": "success rate: the seeds scoring above {threshold:g}, of all seeds",
}


def generalization_table(
    groups: Sequence[Group],
    key: str,
    what: str,
    part: str = "mean",
    threshold: float = DEFAULT_SUCCESS_THRESHOLD,
) -> list[str]:
    """A table laid out as Ruoss et al.'s Table 1: one line per task (group), one column per
    encoding (row label),
    each cell the ``part`` (SEED_AGGREGATES) of the runs' ``key`` summaries over the problem
    lengths past the training range, the best per task in bold; per answer byte (a mean or a
    max), beside the task's baselines over the same lengths, the prefix rule among them where
    the accuracies are scored under teacher forcing."""
    labels = list(dict.fromkeys(row.label for group in groups for row in group.rows))
    names = [group.task or group.title for group in groups]
    per_byte = key == "generalization_accuracy" and part != "success"
    baselines = ["chance", "constant answer"] if per_byte else []
    prefix = per_byte and any(
        g.teacher_forced and g.prefix_rule_accuracy is not None for g in groups
    )
    if prefix:
        baselines.append("prefix rule")
    legend = [
        "chance: a uniform guess",
        "constant answer: at each length one fixed answer, the most common byte at each "
        "answer position over the problems scored there",
        "prefix rule: the best rule that reads only the answer's earlier bytes, as teacher "
        "forcing gives them",
    ][: len(baselines)]
    title = (
        f"Length generalization (Ruoss et al. 2023): {what}, "
        f"{SEED_AGGREGATES[part].format(threshold=threshold)}, over the evaluated problem "
        "lengths past each task's training range"
    )
    lines = [
        title + (f" ({'; '.join(legend)}):" if legend else ":"),
        "",
        "| task | " + " | ".join([*labels, *baselines]) + " |",
        "| --- |" + " --- |" * (len(labels) + len(baselines)),
    ]
    for group, name in zip(groups, names, strict=True):
        if names.count(name) > 1:  # the same task trained in several settings
            name = f"{name} ({group.name})"
        stats = {row.label: getattr(row, key) for row in group.rows if getattr(row, key).n}
        texts = seed_aggregate_texts(stats, labels, part, threshold)
        if per_byte:
            values = [group.chance_accuracy, group.constant_answer_accuracy]
            if prefix:
                values.append(group.prefix_rule_accuracy if group.teacher_forced else None)
            texts += ["–" if value is None else f"{value:.2f}" for value in values]
        lines.append(f"| {name} | " + " | ".join(texts) + " |")
    return lines


def seed_aggregate_texts(
    stats: dict[str, Stat], labels: Sequence[str], part: str, threshold: float
) -> list[str]:
    """Each label's cell of one Table 1 line: its ``part`` of ``stats`` (a dash where it has
    none), the best in bold."""
    shown = {label: seed_aggregates(stat, threshold)[part] for label, stat in stats.items()}
    best = best_shown(shown.values())
    texts = []
    for label in labels:
        stat = stats.get(label)
        if stat is None:
            texts.append("–")
        elif part == "mean":
            texts.append(stat_text(stat, best))
        elif part == "max":
            texts.append(stat_text(Stat.of([shown[label]]), best))
        else:  # "k/n": k of its n seeds above the threshold
            text = f"{sum(value > threshold for value in stat.values)}/{stat.n}"
            texts.append(f"**{text}**" if f"{shown[label]:.2f}" == best else text)
    return texts


def generalization_tables(report: Report) -> list[str]:
    """The Markdown lines of every summary table (none for a sweep without algorithmic tasks),
    each after a blank line."""
    tasks = algorithmic_groups(report)
    if not tasks:
        return []
    lines = []
    for key, what in GENERALIZATION.items():
        for part in SEED_AGGREGATES:
            table = generalization_table(tasks, key, what, part, report.success_threshold)
            lines += ["", *table]
    return [*lines, "", *mean_reciprocal_rank_table(task_scores(tasks))]


def algorithmic_groups(report: Report) -> list[Group]:
    return [group for group in report.groups if group.problem_lengths is not None]


def task_scores(tasks: Sequence[Group]) -> dict[str, list[dict[str, float | None]]]:
    """Per summary (``length_generalization``, ``..._accuracy``), each task's rows' means over
    seeds by row label: what the mean reciprocal rank ranks."""
    return {
        f"length_{key}": [{row.label: getattr(row, key).mean for row in g.rows} for g in tasks]
        for key in GENERALIZATION
    }


def generalization_content(group: Group, threshold: float) -> dict[str, Any] | None:
    """An algorithmic task's length_generalization summaries per row, for report.json: their
    n, mean and std over seeds, the max and the success rate above ``threshold``."""
    if group.problem_lengths is None:
        return None
    return {
        row.label: {
            f"length_{key}_{'success_rate' if part == 'success' else part}": value
            for key in GENERALIZATION
            for part, value in seed_aggregates(getattr(row, key), threshold).items()
        }
        for row in group.rows
    }


def mean_reciprocal_rank_content(report: Report) -> dict[str, dict[str, float]]:
    """Each encoding's mean reciprocal rank across the tasks by each summary, for report.json
    (empty without algorithmic tasks)."""
    scores = task_scores(algorithmic_groups(report))
    return {summary: mean_reciprocal_ranks(per_task) for summary, per_task in scores.items()}


def seed_aggregates(stat: Stat, threshold: float) -> dict[str, Any]:
    """What Table 1 and report.json read from a row's summaries, one per seed (SEED_AGGREGATES'
    parts and n, std): None where it has none."""
    return {
        "n": stat.n,
        "mean": stat.mean,
        "std": stat.std,
        "max": max(stat.values, default=None),
        "success": success_rate(stat.values, threshold),
    }
