"""The algorithmic tasks' blocks: README's compact table, docs/results.md's detail tables and
the accuracy figure, from a summary of a sweep over tasks (Ruoss et al.'s protocol)."""

from __future__ import annotations

import statistics

from posbench.report.aggregate import baselines_over
from posbench.report.docs.source import Source, provenance_line
from posbench.report.figures import FIGURE_DPI, outside_legend
from posbench.report.generalization import (
    SEED_AGGREGATES,
    algorithmic_groups,
    generalization_table,
    mean_reciprocal_rank_table,
    task_scores,
)
from posbench.report.groups import Group, Row
from posbench.report.styles import encoding_style
from posbench.report.tables import markdown_table


def in_range_accuracy(row: Row, group: Group) -> float | None:
    """The row's mean accuracy over the evaluated problem lengths inside the training range."""
    low, high = group.problem_lengths
    means = [c.accuracy.mean for c in row.cells if low <= c.length <= high and c.accuracy.n]
    return statistics.fmean(means) if means else None


def compact_table(source: Source) -> str:
    """Per task, two lines, inside the training range and past it: each encoding's per-token
    accuracy of its own answers (mean over seeds, and the best seed's past it), then chance and
    the constant answer per length over the same lengths."""
    groups = algorithmic_groups(source.report)
    labels = list(
        dict.fromkeys(source.column_label(r) for g in groups for r in source.ordered_rows(g))
    )
    lines = [
        "| task | problem lengths | " + " | ".join(labels) + " | chance | constant answer |",
        "| --- | --- |" + " --- |" * (len(labels) + 2),
    ]
    for group in groups:
        low, high = group.problem_lengths
        inside = [n for n in group.lengths if low <= n <= high]
        past = [n for n in group.lengths if n > high]
        records = source.task_records(group)
        for lengths, is_past in ((inside, False), (past, True)):
            cells = {}
            for row in source.ordered_rows(group):
                if is_past:
                    stat = row.generalization_accuracy
                    cells[source.column_label(row)] = (stat.mean, max(stat.values, default=None))
                else:
                    cells[source.column_label(row)] = (in_range_accuracy(row, group), None)
            best = max((m for m, _ in cells.values() if m is not None), default=None)
            texts = [cell_text(*cells[label], best) if label in cells else "–" for label in labels]
            baselines = baselines_over(records, lengths)
            texts += [
                f"{baselines[name]:.2f}" if baselines[name] is not None else "–"
                for name in ("chance_accuracy", "constant_answer_accuracy")
            ]
            span = f"{lengths[0]}–{lengths[-1]}" + ("" if is_past else " (trained)")
            name = f"`{group.task}`" if not is_past else ""
            lines.append(f"| {name} | {span} | " + " | ".join(texts) + " |")
    return "\n".join(lines)


def cell_text(mean: float | None, best_seed: float | None, best: float | None) -> str:
    """``0.62 (0.71)``: the mean over seeds (bold where it prints as the line's best), then the
    best seed's."""
    if mean is None:
        return "–"
    text = f"{mean:.2f}"
    if best is not None and text == f"{best:.2f}":
        text = f"**{text}**"
    return text if best_seed is None else f"{text} ({best_seed:.2f})"


def detail_tables(source: Source) -> str:
    """Table 1 for both measures and every seed aggregate, the mean reciprocal rank, then each
    task's accuracy by problem length (docs/results.md)."""
    groups = algorithmic_groups(source.report)
    lines = [provenance_line(source)]
    for key, what in (
        ("generalization_accuracy", "per-token accuracy of the model's own answers"),
        ("generalization", "sequence accuracy (whole answer right)"),
    ):
        for part in SEED_AGGREGATES:
            lines += ["", *generalization_table(groups, key, what, part)]
    lines += ["", *mean_reciprocal_rank_table(task_scores(groups))]
    footnotes: dict[str, int] = {}
    for group in groups:
        lengths = "–".join(str(n) for n in group.problem_lengths)
        lines += [
            "",
            f"`{group.task}`, per-token accuracy by problem length (trained on {lengths}):",
            "",
        ]
        lines += markdown_table(group, "accuracy", footnotes, best_of=max)
    lines += [f"- [{n}] {text}" for text, n in footnotes.items()]
    return "\n".join(lines)


def accuracy_panels(source: Source):  # -> matplotlib Figure
    """Per task a panel of per-token accuracy against problem length (mean over seeds), one
    colour per encoding (figures.encoding_style), randomized positions dashed; the legend
    beside the panels, outside the data."""
    from matplotlib.figure import Figure

    groups = algorithmic_groups(source.report)
    figure = Figure(figsize=(4.0 * len(groups) + 2.5, 4.0), dpi=FIGURE_DPI, layout="constrained")
    panels = figure.subplots(1, len(groups), sharey=True, squeeze=False)[0]
    for axes, group in zip(panels, groups, strict=True):
        for row in source.ordered_rows(group):
            points = [(c.length, c.accuracy.mean) for c in row.cells if c.accuracy.n]
            axes.plot(
                *zip(*points, strict=True),
                label=source.column_label(row),
                **encoding_style(row.name, dashed=source.randomized(row)),
            )
        axes.axvspan(*group.problem_lengths, color="grey", alpha=0.15, label="trained lengths")
        if group.chance_accuracy is not None:
            axes.axhline(group.chance_accuracy, color="grey", linestyle=":", label="chance")
        constant = source.baseline_by_length(group, "constant_answer_accuracy")
        if constant:
            axes.plot(
                *zip(*constant, strict=True),
                color="grey",
                linestyle="-.",
                label="constant answer per length",
            )
        axes.set_title(group.task, fontsize="medium")
        axes.set_xlabel("problem length")
        axes.set_ylim(0, 1.02)
        axes.grid(True, alpha=0.3)
    panels[0].set_ylabel("per-token accuracy (mean over seeds)")
    figure.suptitle(f"+experiment={source.experiment}: the model's own answers")
    outside_legend(figure, panels)
    return figure
