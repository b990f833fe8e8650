"""A report as text: the Markdown tables (printed and report.md) and the same numbers as flat
records for report.csv and report.json."""

from __future__ import annotations

import csv
import functools
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posbench.report.generalization import (
    generalization_content,
    generalization_tables,
    mean_reciprocal_rank_content,
)
from posbench.report.groups import METRICS, Group, Report, Row, has_accuracy
from posbench.report.long_context import (
    effective_content,
    effective_rows,
    effective_table,
    sink_content,
    sink_settings,
    sink_table,
)
from posbench.report.reference import compared_rows, published
from posbench.report.run_table import ratio_title
from posbench.report.text import best_shown, stat_text


def multiple(length: int, train_seq_len: int) -> str:
    """How many training lengths ``length`` is, to two decimals ("2×", "1.98×", "30.3×")."""
    return f"{round(length / train_seq_len, 2):g}×"


def length_headers(group: Group) -> list[str]:
    if group.problem_lengths is not None:  # problem lengths: no multiple of a window
        return [str(length) for length in group.lengths]
    return [f"{length} ({multiple(length, group.train_seq_len)})" for length in group.lengths]


def documents_note(group: Group) -> list[str]:
    """How many documents each length scored, for a corpus with documents (nothing for one
    stream): a document shorter than L + 1 bytes is skipped at L, so lengths can differ."""
    counts = [
        sorted({n for row in group.rows for n in row.cells[i].documents})
        for i in range(len(group.lengths))
    ]
    if not any(counts):
        return []
    texts = [", ".join(str(n) for n in c) or "–" for c in counts]
    if len(set(texts)) == 1:
        return [f"Documents scored: {texts[0]} at every length."]
    return [
        "Documents scored at each length (a document shorter than L + 1 bytes is skipped at L: "
        "these lengths score different documents):",
        "",
        "| | " + " | ".join(length_headers(group)) + " |",
        "| --- |" + " --- |" * len(group.lengths),
        "| documents | " + " | ".join(texts) + " |",
    ]


def markdown_table(
    group: Group, metric: str, footnotes: dict[str, int], best_of: Any = min
) -> list[str]:
    """``metric`` a Cell's Stat ("ppl", "ratio", "accuracy", ...): one line per row, one column
    per length; the best mean per column (``best_of`` the means: min, or max for accuracies)
    in bold; unsupported cells, measured cells without that metric and rows that are not
    comparable point to a footnote with the reason."""
    lines = [
        "| encoding | runs | " + " | ".join(length_headers(group)) + " |",
        "| --- | --- |" + " --- |" * len(group.lengths),
    ]
    best = [
        best_shown((getattr(row.cells[i], metric).mean for row in group.rows), best_of)
        for i in range(len(group.lengths))
    ]
    for row in group.rows:
        texts = []
        for i, c in enumerate(row.cells):
            stat = getattr(c, metric)
            if c.unsupported is not None:
                texts.append(f"unsupported [{footnote(footnotes, row.encoding, c.unsupported)}]")
            elif metric in c.missing:
                texts.append(f"– [{footnote(footnotes, row.label, c.missing[metric])}]")
            elif stat.mean is None:
                texts.append("–")
            else:
                text = stat_text(stat, best[i])
                texts.append(text if stat.n == len(row.runs) else f"{text} (n={stat.n})")
        lines.append(
            f"| {row_name(row, footnotes)} | {len(row.runs)} | " + " | ".join(texts) + " |"
        )
    return lines


def code_line(code: Sequence[tuple[dict[str, Any] | None, int]]) -> str:
    """What code the runs ran (Report.code): one version, or each with its runs."""
    if len(code) == 1:
        return f"Code: {code_text(code[0][0])}."
    versions = "; ".join(f"{code_text(v)} ({n} run{'s' if n > 1 else ''})" for v, n in code)
    return (
        f"Code: the results come from {len(code)} versions (results.json's `versions`, "
        f"re-evaluations' too; one config and seed can give other numbers under other code): "
        f"{versions}."
    )


def code_text(versions: dict[str, Any] | None) -> str:
    if versions is None:
        return "not recorded (runs written before posbench recorded it)"
    commit = versions.get("git_commit")
    at = ""
    if commit is not None:
        at = f" at {commit[:12]}" + (" with edits" if versions.get("git_dirty") else "")
    return (
        f"posbench {versions.get('posbench')}{at}, torch {versions.get('torch')}, "
        f"Python {versions.get('python')}"
    )


def footnote(footnotes: dict[str, int], subject: str, why: str) -> int:
    """The number of the footnote "subject: why", a new one the first time it is needed."""
    return footnotes.setdefault(f"{subject}: {why}", len(footnotes) + 1)


def row_name(row: Row, footnotes: dict[str, int]) -> str:
    """A row's label in a table, pointing to the footnotes that say why when it is not
    comparable (one footnote for all rows of an encoding) and when its runs trained at another
    precision than the table's others."""
    numbers = []
    if row.not_comparable is not None:
        numbers.append(footnote(footnotes, row.encoding, row.not_comparable))
    if row.other_precision is not None:
        numbers.append(footnote(footnotes, row.label, row.other_precision))
    return f"{row.label} [{', '.join(map(str, numbers))}]" if numbers else row.label


def position_table(group: Group, footnotes: dict[str, int]) -> list[str]:
    """Where in the window the loss rises, at the group's longest length with loss by
    position: each row's NLL before and from the training length, and their ratio."""
    S, length = group.train_seq_len, group.position_length
    lines = [
        f"Loss by position at {length} tokens ({multiple(length, S)}): mean NLL (nats per "
        f"token) at positions < {S} (before the training length) and >= {S} (after), "
        "token-weighted over the position buckets, and after / before per run:",
        "",
        "| encoding | runs | nll before | nll after | nll after / before |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in group.rows:
        curve = row.by_position
        if curve is not None:
            stats = (curve.before, curve.after, curve.ratio)
            texts = ["–" if stat.mean is None else stat_text(stat) for stat in stats]
            lines.append(
                f"| {row_name(row, footnotes)} | {curve.before.n} | " + " | ".join(texts) + " |"
            )
    return lines


ACCURACIES = {
    "accuracy": (
        "Accuracy (answer bytes right in the model's own answer: written at placeholders, "
        "or decoded greedily; flip_flop's reads given the true sequence, as its paper scores them)"
    ),
    "sequence_accuracy": "Sequence accuracy (examples whose whole answer is right)",
}


def depth_table(group: Group, footnotes: dict[str, int]) -> list[str]:
    """Passkey accuracy per depth of the needle at the group's ``depth_length``."""
    depths = sorted({d for row in group.rows if row.by_depth for d in row.by_depth})
    length = group.depth_length
    lines = [
        f"Accuracy by depth of the pass key in the filler, at {length} tokens "
        f"({multiple(length, group.train_seq_len)}; 0 % = first, 100 % = just before the "
        "question):",
        "",
        "| encoding | runs | " + " | ".join(f"{d} %" for d in depths) + " |",
        "| --- | --- |" + " --- |" * len(depths),
    ]
    for row in group.rows:
        if row.by_depth:
            texts = [stat_text(row.by_depth[d]) if d in row.by_depth else "–" for d in depths]
            n = max(stat.n for stat in row.by_depth.values())
            lines.append(f"| {row_name(row, footnotes)} | {n} | " + " | ".join(texts) + " |")
    return lines


def reference_tables(report: Report, group: Group, footnotes: dict[str, int]) -> list[str]:
    """The group beside its reference table (``--reference``): a line per length, a column for
    each row the table meets with the table's number beside it (a "paper" column), as ratios
    to the training length (the shape to compare) and as values."""
    reference, table = report.reference, group.reference
    assert reference is not None and table is not None, "a group with compared rows has both"
    rows = compared_rows(group)
    header = ["length"]
    for row in rows:
        header += [row_name(row, footnotes), f"{row.name} (paper)"]
    lines = [
        f"### Beside {reference.title}: {table.source}, trained at {table.train_seq_len}",
        "",
        f"{reference.citation} Its numbers are {reference.metric} of {reference.model}; "
        f"{reference.protocol}. Their values are that model's; their ratios to the training "
        "length are the shape to compare with this sweep's.",
    ]
    shown = (
        ("ratio", ratio_title(group.train_seq_len, report.metric)),
        ("value", METRICS[report.metric]),
    )
    for part, what in shown:
        lines += ["", f"{what}, this sweep's and the paper's:", ""]
        lines += ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
        for i, (length, title) in enumerate(zip(group.lengths, length_headers(group), strict=True)):
            texts = [title]
            for row in rows:
                ours = getattr(row.cells[i], part)
                texts.append("–" if ours.mean is None else stat_text(ours))
                texts.append(paper_text(group, row, length, part, footnotes))
            lines.append("| " + " | ".join(texts) + " |")
    return lines


def paper_text(group: Group, row: Row, length: int, part: str, footnotes: dict[str, int]) -> str:
    """The reference's ``part`` ("value" or "ratio") for ``row`` at ``length``: a number, a
    dash pointing to the footnote that says why the publication has none, or a dash where it
    was not evaluated at that length."""
    number = published(group, row, length)[part]
    if number is not None:
        return f"{number:.2f}"
    assert group.reference is not None, "only compared rows get a paper column"
    if length not in group.reference.values[row.name]:
        return "–"
    why = group.reference.missing[row.name]
    return f"– [{footnote(footnotes, f'{row.name} (paper)', why)}]"


def markdown(report: Report) -> str:
    n_runs = sum(len({p for row in g.rows for p in row.runs}) for g in report.groups)
    lines = [
        f"# posbench report: {', '.join(str(d) for d in report.dirs)}",
        "",
        f"{n_runs} run{'s' if n_runs != 1 else ''}. Cells: mean ± sample standard deviation "
        "(n − 1) over the runs (seeds) of a row; a single run shows its value alone, (n=k) marks "
        "a cell fewer runs measured. Best mean per column in bold (lowest perplexity, highest "
        "accuracy; none where every mean prints alike).",
    ]
    lines += ["", code_line(report.code)]
    if report.metric_note is not None:
        lines += ["", report.metric_note]
    footnotes: dict[str, int] = {}
    lines += generalization_tables(report)
    for group in report.groups:
        lines += ["", f"## {group.title}"]
        if group.problem_lengths is None:  # an algorithmic task's ppl says little
            lines += ["", f"{METRICS[report.metric]}:", ""]
            lines += markdown_table(group, "value", footnotes)
            if note := documents_note(group):
                lines += ["", *note]
            title = ratio_title(group.train_seq_len, report.metric)
            lines += ["", f"{title}, each run against its own:", ""]
            lines += markdown_table(group, "ratio", footnotes)
        if has_accuracy(group):
            for metric, what in ACCURACIES.items():
                lines += ["", f"{what}:", ""]
                lines += markdown_table(group, metric, footnotes, best_of=max)
        named = functools.partial(row_name, footnotes=footnotes)
        if effective_rows(group):
            lines += ["", *effective_table(report, group, named)]
        if sink_settings(group):
            lines += ["", *sink_table(group, named)]
        if group.depth_length is not None:
            lines += ["", *depth_table(group, footnotes)]
        if group.position_length is not None:
            lines += ["", *position_table(group, footnotes)]
        if compared_rows(group):
            lines += ["", *reference_tables(report, group, footnotes)]
    if footnotes:
        lines += [""] + [f"- [{n}] {text}" for text, n in footnotes.items()]
    if report.excluded:
        lines += ["", "Excluded runs (not in the means):", ""]
        lines += [f"- `{relative(e.path, report.root)}`: {e.reason}" for e in report.excluded]
    if report.duplicates:
        what = "a newer run's config and seed, run again: one seed, not in the means"
        lines += ["", f"Duplicates ({what}):", ""]
        lines += [
            f"- `{relative(d.path, report.root)}`: duplicate of `{relative(d.of, report.root)}`"
            for d in report.duplicates
        ]
    return "\n".join(lines) + "\n"


def relative(path: Path, root: Path) -> str:
    path, root = path.absolute(), root.absolute()
    return str(path.relative_to(root)) if path != root else "."


CSV_FIELDS = [
    "group",
    "encoding",
    "scaling",
    "stride",
    "positions",
    "runs",
    "comparable",
    "length",
    "multiple",
    "status",
    "reason",
    "ppl_n",
    "ppl_mean",
    "ppl_std",
    "metric",
    "value_n",
    "value_mean",
    "value_std",
    "ratio_n",
    "ratio_mean",
    "ratio_std",
    "paper_value",
    "paper_ratio",
    "accuracy_n",
    "accuracy_mean",
    "accuracy_std",
    "sequence_accuracy_n",
    "sequence_accuracy_mean",
    "sequence_accuracy_std",
    "documents_min",
    "documents_max",
    "effective_length_n",  # the row's, repeated at each of its lengths
    "effective_length_mean",
    "effective_length_std",
]


def cell_records(report: Report) -> list[dict[str, Any]]:
    """One flat record per (group, row, length): the rows of report.csv and report.json."""
    return [
        {
            "group": group.name,
            "encoding": row.label,
            "scaling": row.scaling,
            "stride": row.stride,
            "positions": row.positions,
            "runs": len(row.runs),
            "comparable": row.not_comparable is None,
            "length": c.length,
            "multiple": None if group.problem_lengths else c.length / group.train_seq_len,
            "status": "unsupported"
            if c.unsupported is not None
            else "ok"
            if c.ppl.n
            else "missing",
            # why the cell, or its value or ratio, has no number
            "reason": c.unsupported or "; ".join(dict.fromkeys(c.missing.values())) or None,
            "ppl_n": c.ppl.n,
            "ppl_mean": c.ppl.mean,
            "ppl_std": c.ppl.std,
            "metric": report.metric,  # what value_* and ratio_* are
            "value_n": c.value.n,
            "value_mean": c.value.mean,
            "value_std": c.value.std,
            "ratio_n": c.ratio.n,
            "ratio_mean": c.ratio.mean,
            "ratio_std": c.ratio.std,
            # --reference's number for the row's encoding at this length, and its ratio
            **{f"paper_{part}": number for part, number in published(group, row, c.length).items()},
            **{
                f"{metric}_{part}": getattr(getattr(c, metric), part)
                for metric in ACCURACIES
                for part in ("n", "mean", "std")
            },
            "documents_min": min(c.documents, default=None),
            "documents_max": max(c.documents, default=None),
            **{f"effective_length_{p}": getattr(row.effective, p) for p in ("n", "mean", "std")},
        }
        for group in report.groups
        for row in group.rows
        for c in row.cells
    ]


def csv_text(records: Sequence[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(records)
    return buffer.getvalue()


def json_content(report: Report, records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {
        "root": str(report.root),  # the runs' and excluded paths below are relative to it
        "dirs": [str(d) for d in report.dirs],
        "metric": report.metric,
        "metric_note": report.metric_note,
        "std": "sample standard deviation (n - 1) over runs; null for a single run",
        "groups": [
            {
                "name": g.name,
                "title": g.title,
                "setting": g.setting,
                "train_seq_len": g.train_seq_len,
                "problem_lengths": g.problem_lengths,
                "length_generalization": generalization_content(g, report.success_threshold),
                "chance_accuracy": g.chance_accuracy,
                "constant_answer_accuracy": g.constant_answer_accuracy,
                "prefix_rule_accuracy": g.prefix_rule_accuracy,
                "rows": {row.label: [relative(p, report.root) for p in row.runs] for row in g.rows},
                "loss_by_position": position_content(g),
                "accuracy_by_depth": depth_content(g),
                "effective_context_length": effective_content(report, g),
                "sink": sink_content(g),
                "reference": reference_content(report, g),
            }
            for g in report.groups
        ],
        "cells": list(records),
        # an algorithmic sweep's: Table 1's success rates count the seeds above it, and each
        # encoding's mean reciprocal rank across the tasks by each summary
        "success_threshold": report.success_threshold,
        "mean_reciprocal_rank": mean_reciprocal_rank_content(report),
        "code": [{"versions": versions, "runs": n} for versions, n in report.code],
        "excluded": [
            {"path": relative(e.path, report.root), "reason": e.reason} for e in report.excluded
        ],
        "duplicates": [
            {"path": relative(d.path, report.root), "duplicate_of": relative(d.of, report.root)}
            for d in report.duplicates
        ],
    }


def reference_content(report: Report, group: Group) -> dict[str, Any] | None:
    """Which published table the group is read against, for report.json (its numbers are in
    the cells' paper_value and paper_ratio)."""
    reference, table = report.reference, group.reference
    if reference is None or table is None:
        return None
    return {
        "name": reference.name,
        "citation": reference.citation,
        "source": table.source,
        "train_seq_len": table.train_seq_len,
        "metric": reference.metric,
    }


def depth_content(group: Group) -> dict[str, Any] | None:
    """The group's passkey accuracy per needle depth, for report.json."""
    if group.depth_length is None:
        return None
    rows = {
        row.label: {
            "depth_percent": list(row.by_depth),
            **{
                f"accuracy_{part}": [getattr(stat, part) for stat in row.by_depth.values()]
                for part in ("n", "mean", "std")
            },
        }
        for row in group.rows
        if row.by_depth
    }
    return {"length": group.depth_length, "rows": rows}


def position_content(group: Group) -> dict[str, Any] | None:
    """The group's loss-by-position curves and before/after split, for report.json."""
    if group.position_length is None:
        return None
    rows = {}
    for row in group.rows:
        curve = row.by_position
        if curve is not None:
            rows[row.label] = {
                "start": [start for start, _ in curve.buckets],
                "end": [end for _, end in curve.buckets],
                "nll_n": [stat.n for stat in curve.nll],
                "nll_mean": [stat.mean for stat in curve.nll],
                "nll_std": [stat.std for stat in curve.nll],
                **{
                    f"{name}_{part}": getattr(getattr(curve, name), part)
                    for name in ("before", "after", "ratio")
                    for part in ("n", "mean", "std")
                },
            }
    return {"length": group.position_length, "rows": rows}
