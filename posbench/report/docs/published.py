"""A published table's blocks (posbench/report/published.py): its ratios beside the paper's,
read from posbench/references, as a table and a figure."""

from __future__ import annotations

from posbench.references import ReferenceTable, load_reference
from posbench.report.figures import FIGURE_DPI, METRIC_AXES, cover_values, outside_legend
from posbench.report.published import PublishedTable
from posbench.report.styles import encoding_style


def paper_table(table: PublishedTable) -> ReferenceTable | None:
    """The reference's table at the published table's training length, if it names one."""
    if table.reference is None:
        return None
    return load_reference(table.reference).table(table.train_seq_len)


def column_order(table: PublishedTable, paper: ReferenceTable | None) -> list[str]:
    """The encodings the paper has first, then the rest, each part by its ratio at the longest
    length (flattest first)."""
    longest = table.lengths[-1]
    in_paper = set(paper.values) if paper else set()
    return sorted(table.ratios, key=lambda e: (e not in in_paper, table.ratios[e][longest], e))


def published_provenance(table: PublishedTable) -> str:
    """Where the table's numbers come from, and that no per-run records back them."""
    p = table.provenance
    commands = " and ".join(f"`{c}`" for c in p["commands"])
    missing = "".join(f" No {e} row: it {why}." for e, why in p["not_measured"].items())
    return (
        f"{commands} on {p['machine']}, {p['date']} (posbench {p['posbench_commit'][:7]}); "
        f"a published table, `{table.name}`: {p['source']}; no per-run records back it until "
        f"it is re-measured.{missing}"
    )


def published_ratio_table(table: PublishedTable) -> str:
    """Per length, each encoding's ratio to the training length, a paper column beside each
    encoding the reference has; the last line the values at the training length."""
    paper = paper_table(table)
    columns: list[tuple[str, bool]] = []  # (encoding, the paper's column)
    for encoding in column_order(table, paper):
        columns.append((encoding, False))
        if paper is not None and encoding in paper.values:
            columns.append((encoding, True))
    lines = [
        "| length | " + " | ".join("(paper)" if p else e for e, p in columns) + " |",
        "| --- |" + " --- |" * len(columns),
    ]
    for n in table.lengths:
        texts = []
        for encoding, is_paper in columns:
            ratio = paper.ratio(encoding, n) if is_paper and paper else table.ratios[encoding][n]
            missing = paper.missing.get(encoding, "no number") if is_paper and paper else "–"
            texts.append(f"{ratio:.2f}" if ratio is not None else short(missing))
        lines.append(f"| {n} | " + " | ".join(texts) + " |")
    at_train = [
        paper.values[e][table.train_seq_len] if p and paper else table.at_train_seq_len[e]
        for e, p in columns
    ]
    label = f"{table.metric.replace('_', ' ')} at {table.train_seq_len}"
    lines.append(f"| {label} | " + " | ".join(f"{v:.2f}" for v in at_train) + " |")
    return "\n".join(lines)


def short(why: str) -> str:
    """A paper cell without a number: "OOM" where the paper ran out of memory, else a dash."""
    return "OOM" if why.startswith("out of memory") else "–"


def published_ratio_figure(table: PublishedTable):  # -> matplotlib Figure
    """Each encoding's ratio against evaluation length (log x, log y), the paper's dotted with
    crosses in the same colour; the legend outside the axes."""
    from matplotlib.figure import Figure

    paper = paper_table(table)
    figure = Figure(figsize=(9.0, 5.0), dpi=FIGURE_DPI, layout="constrained")
    axes = figure.add_subplot()
    plotted = []
    for encoding in column_order(table, paper):
        points = sorted(table.ratios[encoding].items())
        axes.plot(*zip(*points, strict=True), label=encoding, **encoding_style(encoding))
        plotted += [r for _, r in points]
        if paper is not None and encoding in paper.values:
            ratios = paper.ratio_points(encoding)
            style = {**encoding_style(encoding), "linestyle": ":", "marker": "x"}
            axes.plot(*zip(*ratios, strict=True), label=f"{encoding} (paper)", **style)
            plotted += [r for _, r in ratios]
    axes.axvline(table.train_seq_len, color="grey", linestyle="--", label="training length")
    axes.set_xscale("log", base=2)
    axes.set_xticks(table.lengths, labels=[str(n) for n in table.lengths])
    cover_values(axes, plotted)
    axes.set_xlabel("evaluation length (tokens; the paper's: words)")
    axes.set_ylabel(f"{METRIC_AXES[table.metric]}, ratio to {table.train_seq_len}")
    axes.grid(True, which="both", alpha=0.3)
    if paper is not None:
        axes.set_title(f"beside {table.reference}, {paper.source}", fontsize="small")
    outside_legend(figure, [axes])
    figure.suptitle(f"+experiment={table.experiment}, {table.provenance['machine']}")
    return figure
