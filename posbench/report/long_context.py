"""Whether a row's runs use their context, as tables: the effective context length
(runs.results.effective_length, at ``--effective-threshold``) and, for runs ``posbench
diagnose`` measured, the attention-sink rate Sink^eps_k (evaluation/diagnose.py) by encoding."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from posbench.report.cells import Stat
from posbench.report.groups import Group, Report, Row
from posbench.report.text import stat_text


def effective_rows(group: Group) -> list[Row]:
    """The rows with an effective context length (none for an algorithmic task)."""
    return [row for row in group.rows if row.effective_metric]


def effective_table(report: Report, group: Group, row_name: Callable[[Row], str]) -> list[str]:
    """One line per row: its runs' effective context length, in tokens and in training
    lengths; ``row_name`` (tables.row_name) labels a row."""
    S, t = group.train_seq_len, report.effective_threshold
    lines = [
        f"Effective context length at threshold {t:g}: the longest evaluated length L such that "
        f"every evaluated length from {S} to L keeps its score within {t:g} of the score at "
        f"{S} (perplexity-like scores <= score at {S} / {t:g}, accuracy >= {t:g} × accuracy at "
        f"{S}), per run; – where {S} itself was not measured that way:",
        "",
        "| encoding | runs | score | effective length | × training length |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in effective_rows(group):
        stat = row.effective
        texts = ["–", "–"]
        if stat.mean is not None:
            texts = [stat_text(stat), stat_text(Stat.of([n / S for n in stat.values]))]
        cells = [row_name(row), str(len(row.runs)), row.effective_metric, *texts]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def effective_content(report: Report, group: Group) -> dict[str, Any] | None:
    """The group's effective context lengths for report.json: the threshold and, per row, the
    score read and each run's length."""
    rows = effective_rows(group)
    if not rows:
        return None
    return {
        "threshold": report.effective_threshold,
        "rows": {
            row.label: {"metric": row.effective_metric, "lengths": list(row.effective.values)}
            for row in rows
        },
    }
