"""A corpus sweep's blocks (perplexity against evaluation length): README's ratio table and
per-family figure of the experiment's own runs, and docs/results.md's tables of every row
(variants from later sweeps beside them: eval-time scaling, options, randomized positions)."""

from __future__ import annotations

import numpy as np

from posbench.report.docs.source import Source, provenance_line
from posbench.report.figures import ENCODING_FAMILIES, FIGURE_DPI, encoding_style
from posbench.report.groups import Group, Row
from posbench.report.tables import markdown_table, position_table
from posbench.report.text import best_shown


def row_labels(rows: list[Row]) -> dict[int, str]:
    """Each row's label in README's table and figure: its encoding's name where that tells the
    rows apart (an option that differs only from a variant's row is not shown), else its
    report label."""
    names = [row.name for row in rows]
    unique = len(set(names)) == len(names)
    return {id(row): row.name if unique else row.label for row in rows}


def ratio_table(source: Source) -> str:
    """The experiment's own rows: each one's perplexity at the training length, then its ratio
    at each longer length (mean over seeds, below 1: the longer context helps), rows by the
    ratio at the longest length, the best of each column in bold."""
    group = source.main_group()
    rows = source.main_rows(group)
    labels = row_labels(rows)
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

    rows = sorted(rows, key=last_ratio)
    best_ppl = best_shown((row.cells[at_train].value.mean for row in rows), min)
    best = {i: best_shown((row.cells[i].ratio.mean for row in rows), min) for i in longer}
    for row in rows:
        texts = [mean_text(row.cells[at_train].value.mean, best_ppl)]
        for i in longer:
            c = row.cells[i]
            texts.append("unsupported" if c.unsupported else mean_text(c.ratio.mean, best[i]))
        lines.append(f"| {labels[id(row)]} | " + " | ".join(texts) + " |")
    return "\n".join(lines)


def mean_text(mean: float | None, best: str | None) -> str:
    """A mean to two decimals, bold where it prints as ``best``; a dash where unmeasured."""
    if mean is None:
        return "–"
    return f"**{mean:.2f}**" if f"{mean:.2f}" == best else f"{mean:.2f}"


def entropy_floor(source: Source) -> str:
    """The data's best possible perplexity (its entropy floor, from the runs' records), the
    number README's ratios are read against."""
    floors = {run.results["data"].get("entropy_floor_bits_per_byte") for run in source.runs}
    (bits,) = floors
    return f"{2**bits:.2f}"


def corpus_details(source: Source) -> str:
    """Per group (randomized positions train apart): perplexity and its ratio to the training
    length, mean ± std over seeds, every row; then the loss by position at the longest
    length."""
    lines = [provenance_line(source)]
    footnotes: dict[str, int] = {}
    for group in source.report.groups:
        lines += ["", f"{group.title}: perplexity, mean ± sample std over seeds (lowest in bold):"]
        lines += ["", *markdown_table(group, "value", footnotes)]
        lines += ["", "Its ratio to the perplexity at the training length, run by run:"]
        lines += ["", *markdown_table(group, "ratio", footnotes)]
        if group.position_length is not None:
            lines += [
                "",
                f"Loss by position at {group.position_length} tokens: mean NLL (nats per token) "
                "before and after the training length, and their ratio run by run:",
                "",
                *position_table(group, footnotes),
            ]
    lines += ["", *(f"- [{n}] {text}" for text, n in footnotes.items())]
    return "\n".join(lines)


def draw_rows(axes, group: Group, rows: list[Row], labels: dict[int, str]) -> None:
    """Each row's mean perplexity against length, ± one std shaded, in its encoding's style
    (a row of the same encoding after the first dashed); the training length marked."""
    seen: set[str] = set()
    for row in rows:
        points = [(c.length, c.value.mean, c.value.std or 0.0) for c in row.cells if c.value.n]
        lengths, means, stds = (np.array(v) for v in zip(*points, strict=True))
        style = encoding_style(row.name, dashed=row.name in seen)
        seen.add(row.name)
        axes.plot(lengths, means, label=labels[id(row)], **style)
        axes.fill_between(lengths, means - stds, means + stds, color=style["color"], alpha=0.15)
    axes.axvline(group.train_seq_len, color="grey", linestyle=":", label="training length")
    axes.set_xscale("log", base=2)
    axes.set_xticks(group.lengths, labels=[str(n) for n in group.lengths])
    axes.grid(True, alpha=0.3)


def figure_legend(figure, panels) -> None:
    """One legend for every panel, beside them, each label once in the order first drawn."""
    legend = {}
    for axes in panels:
        for handle, label in zip(*axes.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    figure.legend(list(legend.values()), list(legend), loc="outside right center", fontsize="small")


def family_panels(source: Source):  # -> matplotlib Figure
    """The experiment's own rows' perplexity against evaluation length (log x), one panel per
    family of encodings (figures.ENCODING_FAMILIES) with NoPE in each as the common reference,
    mean over seeds ± one std shaded; the legend outside the panels."""
    from matplotlib.figure import Figure

    group = source.main_group()
    rows = source.main_rows(group)
    labels = row_labels(rows)
    families = [
        (family, [row for row in rows if row.name in members])
        for family, members in ENCODING_FAMILIES.items()
    ]
    families = [(family, members) for family, members in families if members]
    reference = [row for row in rows if row.name == "none"]
    figure = Figure(figsize=(11.0, 7.5), dpi=FIGURE_DPI, layout="constrained")
    panels = figure.subplots(2, (len(families) + 1) // 2, sharex=True, sharey=True, squeeze=False)
    for axes, (family, members) in zip(panels.flat, families, strict=False):
        draw_rows(axes, group, members + [r for r in reference if r not in members], labels)
        axes.set_title(family, fontsize="medium")
    for axes in panels[-1]:
        axes.set_xlabel("evaluation length (tokens)")
    for axes in panels[:, 0]:
        axes.set_ylabel("perplexity (mean over seeds)")
    for axes in list(panels.flat)[len(families) :]:
        axes.set_visible(False)
    figure_legend(figure, panels.flat)
    figure.suptitle(f"+experiment={source.experiment}: perplexity against evaluation length")
    return figure


def rope_variants_panel(source: Source):  # -> matplotlib Figure
    """RoPE's rows of the group holding the experiment's runs (options, eval-time scaling)
    beside NoPE's, perplexity against evaluation length; the legend outside the axes."""
    from matplotlib.figure import Figure

    group = source.main_group()
    rows = [row for row in group.rows if row.name in ("none", "rope")]
    figure = Figure(figsize=(9.0, 5.0), dpi=FIGURE_DPI, layout="constrained")
    axes = figure.add_subplot()
    draw_rows(axes, group, rows, {id(row): row.label for row in rows})
    axes.set_xlabel("evaluation length (tokens)")
    axes.set_ylabel("perplexity (mean over seeds ± std)")
    figure_legend(figure, [axes])
    figure.suptitle(f"+experiment={source.experiment}: RoPE's variants beside NoPE")
    return figure
