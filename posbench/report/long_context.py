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


def tokens_text(stat: Stat) -> str:
    """A mean (± std) of lengths in whole tokens: "512", "384 ± 181"."""
    return f"{stat.mean:.0f}" + ("" if stat.std is None else f" ± {stat.std:.0f}")


def effective_table(report: Report, group: Group, row_name: Callable[[Row], str]) -> list[str]:
    """One line per row: its runs' effective context length, in tokens and in training
    lengths; ``row_name`` (tables.row_name) labels a row."""
    S, t = group.train_seq_len, report.effective_threshold
    lines = [
        f"Effective context length at threshold {t:g}: the longest evaluated length L such that "
        f"every evaluated length from {S} to L keeps its score within {t:g} of the score at "
        f"{S} (perplexity-like scores <= score at {S} / {t:g}, accuracy >= {t:g} × accuracy at "
        f"{S}), per run; – where {S} itself was not measured that way, or where a task's "
        f"accuracy there is no better than chance or the constant answer:",
        "",
        "| encoding | runs | score | effective length | × training length |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in effective_rows(group):
        stat = row.effective
        texts = ["–", "–"]
        if stat.mean is not None:
            over = "" if stat.n == len(row.runs) else f" (n={stat.n})"  # as the other cells
            ratio = stat_text(Stat.of([n / S for n in stat.values]))
            texts = [tokens_text(stat) + over, ratio + over]
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


def sink_settings(group: Group) -> list[tuple[int, float, int]]:
    """The (length, eps, k) at which some run of the group was diagnosed."""
    return sorted({setting for row in group.rows for setting in row.sink})


def sink_table(group: Group, row_name: Callable[[Row], str]) -> list[str]:
    """One line per row that ``posbench diagnose`` measured, one column per (length, eps, k):
    Sink^eps_k over its runs."""
    settings = sink_settings(group)
    lines = [
        "Attention sinks (posbench diagnose): Sink^eps_k, the share of heads whose mean attention "
        "on token k exceeds eps (Gu et al. 2025), each window thresholded alone:",
        "",
        "| encoding | "
        + " | ".join(f"{n} tokens, eps {eps:g}, k {k}" for n, eps, k in settings)
        + " |",
        "| --- |" + " --- |" * len(settings),
    ]
    for row in group.rows:
        if row.sink:
            texts = [stat_text(row.sink[s]) if s in row.sink else "–" for s in settings]
            lines.append(f"| {row_name(row)} | " + " | ".join(texts) + " |")
    return lines


def sink_content(group: Group) -> list[dict[str, Any]] | None:
    """The group's sink rates for report.json: one entry per row and (length, eps, k)."""
    entries = [
        {
            "encoding": row.label,
            "length": length,
            "sink_epsilon": eps,
            "sink_token": k,
            **{f"sink_rate_{part}": getattr(stat, part) for part in ("n", "mean", "std")},
        }
        for row in group.rows
        for (length, eps, k), stat in row.sink.items()
    ]
    return entries or None
