"""README's and docs/'s results, rendered from the summaries committed under results/ (summary.py),
never typed:

    python -m posbench.report.docs           # re-render every block and figure from results/
    python -m posbench.report.docs --check   # exit 1, naming each block a hand edit changed

A block in a Markdown file sits between ``<!-- rendered: NAME -->`` and ``<!-- /rendered -->``;
NAME is one of BLOCKS, each drawn from one summary by one function. FIGURES are the PNGs drawn
the same way (the check compares the Markdown only: a PNG's bytes vary with the fonts and the
matplotlib build). Re-measuring a result: replace its summary, run this, commit both.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from posbench.report.aggregate import baselines_over
from posbench.report.figures import ENCODING_FAMILIES, ENCODING_STYLES, FIGURE_DPI, encoding_style
from posbench.report.generalization import (
    SEED_AGGREGATES,
    algorithmic_groups,
    generalization_table,
    mean_reciprocal_rank_table,
    task_scores,
)
from posbench.report.groups import Group, Report, Row, build_report
from posbench.report.read import Run
from posbench.report.summary import read_summary, summary_provenance
from posbench.report.tables import markdown_table
from posbench.report.text import best_shown
from posbench.system.atomic import atomic_path, atomic_write

ROOT = Path(__file__).resolve().parents[2]  # the repository: README.md, docs/, results/
PAGES = ("README.md", "docs")  # the Markdown searched for blocks (docs/: every page)
RENDERED = re.compile(
    r"(?P<open><!-- rendered: (?P<name>[\w/.-]+) -->\n)(?P<body>.*?)(?P<close><!-- /rendered -->)",
    re.DOTALL,
)


@dataclass(frozen=True)
class Source:
    """One summary, read once: its runs' report and provenance."""

    name: str  # its path in the repository: results/<experiment>/<name>.json
    report: Report
    runs: list[Run]
    provenance: dict

    @classmethod
    def load(cls, root: Path, name: str) -> Source:
        path = root / name
        runs = read_summary(path)
        return cls(name, build_report([path], out=None), runs, summary_provenance(path))

    @property
    def experiment(self) -> str:
        """The experiment its runs are of: results/<experiment>/<name>.json."""
        return Path(self.name).parent.name

    def randomized(self, row: Row) -> bool:
        """Whether the row's runs trained at random positions (train.random_positions)."""
        configs = [run.config for run in self.runs if run.path in row.runs]
        return any(config.get("train.random_positions") is not None for config in configs)

    def column_label(self, row: Row) -> str:
        """A row's column in a compact table: ``rope``, or ``rope, random`` for randomized
        positions."""
        if not self.randomized(row):
            return row.label
        return re.sub(r" \(random_positions=\d+\)", "", row.label) + ", random"

    def task_records(self, group: Group) -> list[dict]:
        """Every evaluation record of the runs on the group's task."""
        return [
            r
            for run in self.runs
            if run.config.get("data.name") == group.task
            for r in run.results["eval"]
        ]

    def baseline_by_length(self, group: Group, name: str) -> list[tuple[int, float]]:
        """(length, mean of the records' ``name`` there) over the group's task's records."""
        records = [r for r in self.task_records(group) if r.get(name) is not None]
        return [
            (n, statistics.fmean(r[name] for r in records if r["length"] == n))
            for n in group.lengths
            if any(r["length"] == n for r in records)
        ]

    def ordered_rows(self, group: Group) -> list[Row]:
        """Consecutive positions first, then randomized ones, each by family (ENCODING_STYLES)."""
        order = list(ENCODING_STYLES)
        return sorted(
            group.rows, key=lambda row: (self.randomized(row), order.index(row.name), row.label)
        )


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


def provenance_line(source: Source) -> str:
    """How the summary's runs were made: the command, how many runs, the machine, the date and
    the wall time."""
    p = source.provenance
    commands = " and ".join(f"`{c}`" for c in p["commands"] if c) or "(command not recorded)"
    minutes = (
        f", {p['wall_s'] / 60:.0f} min from the first job's start to the last result"
        if p["wall_s"]
        else ""
    )
    return (
        f"{p['runs']} runs of {commands} on {p['machine']}, {p['date']}{minutes}; "
        f"summary: `{source.name}`."
    )


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
    handles, labels = panels[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside right center", fontsize="small")
    return figure


def ratio_table(source: Source) -> str:
    """A corpus sweep's one group: each row's perplexity at the training length, then its ratio
    at each longer length (mean over seeds, below 1: the longer context helps), rows by the
    ratio at the longest length, the best of each column in bold."""
    (group,) = source.report.groups
    train = group.train_seq_len
    longer = [i for i, n in enumerate(group.lengths) if n > train]
    at_train = group.lengths.index(train)
    lines = [
        f"| encoding | ppl at {train} | "
        + " | ".join(f"{group.lengths[i]} ({group.lengths[i] // train}×)" for i in longer)
        + " |",
        "| --- | --- |" + " --- |" * len(longer),
    ]

    def last_ratio(row: Row) -> float:
        mean = row.cells[longer[-1]].ratio.mean
        return float("inf") if mean is None else mean

    rows = sorted(group.rows, key=last_ratio)
    best_ppl = best_shown((row.cells[at_train].value.mean for row in rows), min)
    best = {i: best_shown((row.cells[i].ratio.mean for row in rows), min) for i in longer}
    for row in rows:
        texts = [mean_text(row.cells[at_train].value.mean, best_ppl)]
        for i in longer:
            c = row.cells[i]
            texts.append("unsupported" if c.unsupported else mean_text(c.ratio.mean, best[i]))
        lines.append(f"| {row.label} | " + " | ".join(texts) + " |")
    return "\n".join(lines)


def mean_text(mean: float | None, best: str | None) -> str:
    """A mean to two decimals, bold where it prints as ``best``; a dash where unmeasured."""
    if mean is None:
        return "–"
    return f"**{mean:.2f}**" if f"{mean:.2f}" == best else f"{mean:.2f}"


def family_panels(source: Source):  # -> matplotlib Figure
    """A corpus sweep's perplexity against evaluation length (log x), one panel per family of
    encodings (figures.ENCODING_FAMILIES) with NoPE in each as the common reference, mean over
    seeds ± one std shaded; the training length marked; the legend outside the panels."""
    from matplotlib.figure import Figure

    (group,) = source.report.groups
    families = [
        (family, [row for row in group.rows if row.name in members])
        for family, members in ENCODING_FAMILIES.items()
    ]
    families = [(family, rows) for family, rows in families if rows]
    reference = [row for row in group.rows if row.name == "none"]
    figure = Figure(figsize=(11.0, 7.5), dpi=FIGURE_DPI, layout="constrained")
    panels = figure.subplots(2, (len(families) + 1) // 2, sharex=True, sharey=True, squeeze=False)
    for axes, (family, rows) in zip(panels.flat, families, strict=False):
        for row in rows + [r for r in reference if r not in rows]:
            points = [(c.length, c.value.mean, c.value.std or 0.0) for c in row.cells if c.value.n]
            lengths, means, stds = (np.array(v) for v in zip(*points, strict=True))
            style = encoding_style(row.name)
            axes.plot(lengths, means, label=row.label, **style)
            axes.fill_between(lengths, means - stds, means + stds, color=style["color"], alpha=0.15)
        axes.axvline(group.train_seq_len, color="grey", linestyle=":", label="training length")
        axes.set_xscale("log", base=2)
        axes.set_xticks(group.lengths, labels=[str(n) for n in group.lengths])
        axes.set_title(family, fontsize="medium")
        axes.grid(True, alpha=0.3)
    for axes in panels[-1]:
        axes.set_xlabel("evaluation length (tokens)")
    for axes in panels[:, 0]:
        axes.set_ylabel("perplexity (mean over seeds)")
    for axes in list(panels.flat)[len(families) :]:
        axes.set_visible(False)
    legend = {}
    for axes in panels.flat:
        for handle, label in zip(*axes.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    ordered = sorted(
        legend,
        key=lambda label: (
            [row.label for row in group.rows].index(label)
            if label in [row.label for row in group.rows]
            else len(group.rows)
        ),
    )
    figure.legend(
        [legend[label] for label in ordered], ordered, loc="outside right center", fontsize="small"
    )
    figure.suptitle(f"+experiment={source.experiment}: perplexity against evaluation length")
    return figure


RUOSS2023_CPU = "results/ruoss2023_cpu/sweep.json"
# block name -> (summary, what it shows)
BLOCKS: dict[str, tuple[str, Callable[[Source], str]]] = {
    "ruoss2023_cpu/table": (RUOSS2023_CPU, compact_table),
    "ruoss2023_cpu/provenance": (RUOSS2023_CPU, provenance_line),
    "ruoss2023_cpu/details": (RUOSS2023_CPU, detail_tables),
}
# figure path -> (summary, what it draws)
FIGURES: dict[str, tuple[str, Callable]] = {
    "docs/figures/ruoss2023_cpu.png": (RUOSS2023_CPU, accuracy_panels),
}


def pages(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def rendered_text(text: str, render: Callable[[str], str]) -> str:
    """``text`` with every block's body replaced by ``render(name)``."""
    return RENDERED.sub(
        lambda m: m["open"] + render(m["name"]).rstrip("\n") + "\n" + m["close"], text
    )


def render(root: Path = ROOT, check: bool = False) -> list[str]:
    """Re-render every block in README.md and docs/ (and, unless ``check``, every figure) from
    the summaries below ``root``; return the blocks whose text differed (``check``: left as
    they are), as ``page: block``."""
    sources: dict[str, Source] = {}

    def source(summary: str) -> Source:
        if summary not in sources:
            sources[summary] = Source.load(root, summary)
        return sources[summary]

    def block(name: str) -> str:
        if name not in BLOCKS:
            raise SystemExit(f"error: no rendered block {name!r}; known: {', '.join(BLOCKS)}")
        summary, show = BLOCKS[name]
        return show(source(summary))

    differing = []
    for page in pages(root):
        text = page.read_text()
        new = rendered_text(text, block)
        if new != text:
            old_blocks = {m["name"]: m["body"] for m in RENDERED.finditer(text)}
            new_blocks = {m["name"]: m["body"] for m in RENDERED.finditer(new)}
            differing += [
                f"{page.relative_to(root)}: {name}"
                for name in new_blocks
                if new_blocks[name] != old_blocks.get(name)
            ]
            if not check:
                atomic_write(page, new.encode())
    if not check:
        for path, (summary, draw) in FIGURES.items():
            with atomic_path(root / path) as tmp:
                draw(source(summary)).savefig(tmp, format="png", dpi=FIGURE_DPI)
    return differing


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m posbench.report.docs",
        description="Render README's and docs/'s result tables and figures from results/.",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="change nothing; exit 1 naming each block whose text differs from its rendering",
    )
    options = parser.parse_args(argv)
    differing = render(check=options.check)
    for entry in differing:
        print(("differs from its summary: " if options.check else "rendered: ") + entry)
    if options.check and differing:
        print("run `python -m posbench.report.docs` and commit; never edit a rendered block")
        sys.exit(1)


if __name__ == "__main__":
    main()
