"""The blocks of a sweep over retrieval tasks scored by the model's own answers: the RULER-style
experiment's (``+experiment=ruler``, docs/ruler.md) table of each encoding's accuracy by length
averaged over the tasks, as RULER's main table averages its 13, with the effective length read
from that average; and, for it and for ``+experiment=retrieval`` (passkey, copy), each task's
accuracy by length. Chance and the constant answer stand beside them: a score means something
only above both."""

from __future__ import annotations

from collections.abc import Sequence

from posbench.report.aggregate import baselines_over
from posbench.report.cells import Stat
from posbench.report.docs.corpus import mean_text
from posbench.report.docs.source import Source, provenance_line
from posbench.report.groups import Group, Row
from posbench.report.styles import ENCODING_STYLES
from posbench.report.tables import length_headers
from posbench.report.text import best_shown, stat_text
from posbench.runs.results import (
    DEFAULT_EFFECTIVE_THRESHOLD,
    baseline_accuracy,
    effective_length,
    mean_of,
)

BASELINES = {"chance": "chance_accuracy", "constant answer": "constant_answer_accuracy"}


def task_groups(source: Source) -> dict[str, Group]:
    """The summary's task groups by their task's ``data.name`` (a corpus group has no
    accuracy: none of its cells measured one)."""
    config = {run.path: run.config for run in source.runs}
    return {
        config[group.rows[0].runs[0]]["data.name"]: group
        for group in source.report.groups
        if any(c.accuracy.n for row in group.rows for c in row.cells)
    }


def encoding_rows(group: Group) -> dict[str, Row]:
    """The group's rows measured as trained, by encoding name."""
    return {row.name: row for row in group.rows if row.as_trained}


def accuracy_at(row: Row | None, length: int) -> float | None:
    """The row's accuracy at ``length``, mean over seeds (None: not measured there)."""
    cells = [c for c in row.cells if c.length == length] if row else []
    return cells[0].accuracy.mean if cells else None


def baseline_at(source: Source, group: Group, name: str, length: int) -> float | None:
    """The baseline ``name`` of the group's records at ``length`` (its runs score the same
    examples: they agree)."""
    runs = {path for row in group.rows for path in row.runs}
    records = [r for run in source.runs if run.path in runs for r in run.results["eval"]]
    return baselines_over(records, [length])[name]


def table_header(group: Group, last: Sequence[str]) -> list[str]:
    """A Markdown table's two header lines: encoding, each of the group's lengths (× the
    training length, tables.length_headers), then ``last``."""
    names = ["encoding", *length_headers(group), *last]
    return ["| " + " | ".join(names) + " |", "|" + " --- |" * len(names)]


def cell_text(stat: Stat, best: str | None) -> str:
    """A task's cell: mean ± std over seeds, a dash where no run measured it."""
    return "–" if stat.mean is None else stat_text(stat, best)


def ruler_table(source: Source) -> str:
    """Per encoding, the accuracy of its own answers at each length averaged over the tasks
    (each task's mean over seeds first), and the effective length of that average at
    threshold 0.9 of its value at the training length, as RULER reads its average (relative
    here: docs/long-context.md); then the same for chance and the constant answer; then how
    the summary's runs were made."""
    groups = task_groups(source)
    first = next(iter(groups.values()))
    train, lengths = first.train_seq_len, first.lengths
    assert all(g.train_seq_len == train for g in groups.values()), "one training length"
    order = list(ENCODING_STYLES)
    names = sorted({name for g in groups.values() for name in encoding_rows(g)}, key=order.index)
    means = {
        name: [
            mean_of([accuracy_at(encoding_rows(g).get(name), n) for g in groups.values()])
            for n in lengths
        ]
        for name in names
    }
    best = [best_shown(means[name][i] for name in names) for i in range(len(lengths))]
    # each baseline's average over the tasks by length, by its record key
    baselines = {
        key: [mean_of([baseline_at(source, g, key, n) for g in groups.values()]) for n in lengths]
        for key in BASELINES.values()
    }
    # the average at the training length no better than the baselines' says nothing of the context
    at_train = {key: values[lengths.index(train)] for key, values in baselines.items()}
    floor = baseline_accuracy(at_train)
    effective = f"effective length (× {train}, threshold {DEFAULT_EFFECTIVE_THRESHOLD:g})"
    lines = table_header(first, [effective])
    for name in names:
        scores = dict(zip(lengths, means[name], strict=True))
        reach = effective_length(scores, train, DEFAULT_EFFECTIVE_THRESHOLD, "accuracy", floor)
        texts = [mean_text(m, b) for m, b in zip(means[name], best, strict=True)]
        texts.append("–" if reach is None else f"{reach / train:g}")
        lines.append(f"| {name} | " + " | ".join(texts) + " |")
    for label, key in BASELINES.items():
        texts = [mean_text(value, None) for value in baselines[key]]
        lines.append(f"| *{label}* | " + " | ".join(texts) + " | – |")
    tasks = ", ".join(f"`{task}`" for task in groups)
    return "\n".join(
        [*lines, "", f"Averaged over {len(groups)} tasks: {tasks}. {provenance_line(source)}"]
    )


def task_details(source: Source) -> str:
    """Per task, each encoding's accuracy of its own answers by length (mean ± std over seeds,
    the best of a column in bold), then chance and the constant answer there."""
    order = list(ENCODING_STYLES)
    lines: list[str] = []
    for task, group in task_groups(source).items():
        rows = sorted(encoding_rows(group).values(), key=lambda row: order.index(row.name))
        best = [best_shown(accuracy_at(row, n) for row in rows) for n in group.lengths]
        lines += ["", f"`{task}`:", ""]
        lines += table_header(group, ["runs"])
        for row in rows:
            texts = [
                "unsupported" if c.unsupported else cell_text(c.accuracy, shown)
                for c, shown in zip(row.cells, best, strict=True)
            ]
            lines.append(f"| {row.name} | " + " | ".join(texts) + f" | {len(row.runs)} |")
        for label, key in BASELINES.items():
            texts = [mean_text(baseline_at(source, group, key, n), None) for n in group.lengths]
            lines.append(f"| *{label}* | " + " | ".join(texts) + " | – |")
    return "\n".join(lines[1:])
