"""A report's figures (matplotlib PNGs, one canvas size for all) and its TensorBoard runs, whose
curves overlay in the Scalars tab."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from torch.utils.tensorboard import SummaryWriter

from posbench.references import Reference
from posbench.report.cells import Stat
from posbench.report.groups import Group, Report, Row
from posbench.report.reference import compared_rows

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FIGURE_INCHES = (8.0, 5.0)
FIGURE_DPI = 100  # with FIGURE_INCHES: 800 x 500 pixels
# The perplexity axis is log scaled when its highest value is more than this many times its
# lowest: a curve that blows up past the training length then leaves the others readable. A
# narrower range is linear, where evenly spaced round ticks read better than a log scale's few.
LOG_SCALE_RATIO = 3.0
# A log axis's ticks, by how many decades it spans at most: enough labels to read a value off
# (at least three), never so many that they crowd.
LOG_MANTISSAS = ((1.0, (1, 1.5, 2, 3, 5, 7)), (3.0, (1, 2, 5)), (5.0, (1, 3)), (math.inf, (1,)))
# A linear axis spans at least this fraction of its highest value, so that nearly flat curves
# get round ticks rather than ticks in the fourth decimal.
MIN_LINEAR_SPAN = 0.1
EDGE = 0.02  # of an axis's height beyond its outer ticks: a point on one shows its whole marker

# matplotlib's ten default colours, then the same ten dashed, dash-dotted and dotted: a sweep
# with more than ten rows (every encoding plus scaled re-evaluations) keeps every line distinct.
LINE_STYLES = ("-", "--", "-.", ":")


# One colour and marker per encoding, the same in every figure that draws encodings by name,
# grouped by family (a figure with many encodings draws one panel per family; dashed lines are
# kept for variants, e.g. randomized positions).
ENCODING_FAMILIES = {
    "no positions and absolute": {
        "none": ("black", "o"),
        "learned": ("tab:brown", "v"),
        "sinusoidal": ("tab:olive", "^"),
    },
    "rotary": {
        "rope": ("tab:blue", "s"),
        "xpos": ("tab:cyan", "D"),
        "hybrid": ("navy", "P"),
    },
    "additive biases": {
        "alibi": ("tab:red", "o"),
        "t5": ("tab:orange", "v"),
        "kerple": ("tab:pink", "^"),
        "fire": ("tab:purple", "s"),
        "sandwich": ("gold", "D"),
    },
    "gated and contextual": {
        "fox": ("tab:green", "P"),
        "cope": ("tab:gray", "X"),
    },
}
ENCODING_STYLES = {
    name: style for family in ENCODING_FAMILIES.values() for name, style in family.items()
}


def encoding_style(encoding: str, dashed: bool = False) -> dict[str, str]:
    """The colour and marker of ``encoding`` (ENCODING_STYLES), its line dashed for a variant."""
    colour, marker = ENCODING_STYLES[encoding]
    return {"color": colour, "marker": marker, "linestyle": "--" if dashed else "-"}


def row_style(index: int) -> dict[str, str]:
    """The colour and line style of a group's ``index``-th row, the same in every figure."""
    return {"color": f"C{index % 10}", "linestyle": LINE_STYLES[index // 10 % len(LINE_STYLES)]}


def legend_label(row: Row) -> str:
    """A row's label in a figure's legend, marked when the row is not comparable."""
    return row.label if row.not_comparable is None else f"{row.label} (not comparable)"


def spread(stats: Iterable[Stat]) -> str:
    """What a figure's shading shows, for its y label: the std over seeds where a row has
    several runs to take it over, nothing where every row is one run (no spread to shade)."""
    return " (mean ± std over seeds)" if any(stat.n > 1 for stat in stats) else ""


def covering_ticks(low: float, high: float) -> tuple[str, list[float]]:
    """The scale ("linear" or "log", see LOG_SCALE_RATIO) and round ticks for values in
    ``low``..``high`` (both > 0): the first tick at or below ``low``, the last at or above
    ``high``, so that every value lies inside the labelled range."""
    from matplotlib.ticker import MaxNLocator  # lazily, as in length_figure

    if high / low > LOG_SCALE_RATIO:
        decades = math.log10(high / low)
        mantissas = next(m for most, m in LOG_MANTISSAS if decades <= most)
        exponents = range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
        candidates = [mantissa * 10.0**exponent for exponent in exponents for mantissa in mantissas]
        scale = "log"
    else:
        pad = max(0.0, MIN_LINEAR_SPAN * high - (high - low)) / 2
        low, high = low - pad, high + pad
        locator = MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10])
        # 12 significant digits: 5.1, not the locator's 5.1000000000000005
        candidates = [float(f"{tick:.12g}") for tick in locator.tick_values(low, high)]
        scale = "linear"
    rounding = 1e-9 * high  # a tick computed as 5.000000000001 still covers 5
    first = max(tick for tick in candidates if tick <= low + rounding)
    last = min(tick for tick in candidates if tick >= high - rounding)
    return scale, [tick for tick in candidates if first <= tick <= last]


def beyond(scale: str, first: float, last: float) -> tuple[float, float]:
    """Axis limits EDGE of the axis's height beyond its first and last tick."""
    if scale == "log":
        factor = (last / first) ** EDGE
        return first / factor, last * factor
    margin = EDGE * (last - first)
    return first - margin, last + margin


# The y axis of each metric's figure (posbench.report.groups.METRICS).
METRIC_AXES = {
    "ppl": "perplexity",
    "bits_per_byte": "bits per byte",
    "word_ppl": "word-level perplexity",
}


def value_figure(group: Group, metric: str = "ppl") -> Figure:
    """The cells' mean ``metric`` (perplexity by default) against evaluation length (log x),
    ± one std shaded, one line per row; the y axis linear or log (LOG_SCALE_RATIO), its
    labelled ticks covering every curve and its shading. A fixed FIGURE_INCHES x FIGURE_DPI
    canvas so every report image has the same size."""
    figure, axes = length_figure(group, "value")
    stats = [c.value for row in group.rows for c in row.cells if c.value.n]
    cover_values(axes, [value for stat in stats for value in shaded(stat)])
    axes.set_ylabel(METRIC_AXES[metric] + spread(stats))
    figure.tight_layout()  # arranges the axes inside the fixed canvas; the size stays
    return figure


def cover_values(axes: Any, values: list[float]) -> None:
    """A y axis, linear or log (LOG_SCALE_RATIO), whose labelled ticks cover ``values`` (the
    curves and their shading; a log axis shows only those > 0)."""
    from matplotlib.ticker import NullFormatter, StrMethodFormatter  # lazily, as length_figure

    values = [value for value in values if value > 0]
    if not values:
        return
    scale, ticks = covering_ticks(min(values), max(values))
    axes.set_yscale(scale)
    axes.set_yticks(ticks)
    axes.set_ylim(*beyond(scale, ticks[0], ticks[-1]))
    axes.yaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
    axes.yaxis.set_minor_formatter(NullFormatter())  # a log axis's 2..9: grid lines only


def ratio_figure(group: Group, metric: str, reference: Reference) -> Figure:
    """Each row's mean ratio of ``metric`` to the training length against evaluation length, as
    value_figure draws values, with the ratios of ``reference``'s table for the group (dotted,
    in the colour of the first row of the same encoding that meets it): the shapes side by
    side, where the values of another model are not comparable."""
    figure, axes = length_figure(group, "ratio")
    table = group.reference
    assert table is not None, "a group read against a reference has its table"
    compared = {id(row) for row in compared_rows(group)}
    first: dict[str, int] = {}  # encoding -> the index of its first compared row: its colour
    for index, row in enumerate(group.rows):
        if id(row) in compared:
            first.setdefault(row.name, index)
    paper = []
    for name, index in first.items():
        points = [(n, r) for n in table.lengths if (r := table.ratio(name, n)) is not None]
        lengths, ratios = (np.array(v) for v in zip(*points, strict=True))
        style = {**row_style(index), "linestyle": ":"}
        axes.plot(lengths, ratios, marker="x", label=f"{name} (paper)", **style)
        paper += ratios.tolist()
    stats = [c.ratio for row in group.rows for c in row.cells if c.ratio.n]
    cover_values(axes, [value for stat in stats for value in shaded(stat)] + paper)
    axes.set_ylabel(f"{METRIC_AXES[metric]}, ratio to {group.train_seq_len}" + spread(stats))
    axes.legend(fontsize="small", title=f"paper: {reference.name}, {table.source}")
    figure.tight_layout()
    return figure


def shaded(stat: Stat) -> tuple[float, float, float]:
    """The mean of a curve's point and the two ends of its shading."""
    std = stat.std or 0.0
    return stat.mean - std, stat.mean, stat.mean + std


def accuracy_figure(group: Group) -> Figure:
    """A task's mean accuracy on the answer bytes against evaluation length, as value_figure."""
    figure, axes = length_figure(group, "accuracy")
    axes.set_ylim(0, 1)
    stats = [c.accuracy for row in group.rows for c in row.cells]
    axes.set_ylabel("accuracy on the answer bytes" + spread(stats))
    figure.tight_layout()
    return figure


def length_unit(group: Group) -> str:
    """What a group's lengths count: tokens, of each row's tokenizer where its runs differ in
    theirs (a token of one is not one of another)."""
    if len(group.tokenizers) > 1:
        return f"tokens of each row's tokenizer: {', '.join(group.tokenizers)}"
    return "tokens"


def length_figure(group: Group, metric: str) -> tuple[Figure, Any]:
    """The cells' ``metric`` Stat against evaluation length (log x), ± one std shaded, one
    line per row, the training length marked; the caller labels the y axis."""
    # matplotlib takes a second to import: only commands that draw pay for it
    from matplotlib.figure import Figure

    figure = Figure(figsize=FIGURE_INCHES, dpi=FIGURE_DPI)
    axes = figure.add_subplot()
    for index, row in enumerate(group.rows):
        stats = [(c.length, getattr(c, metric)) for c in row.cells]
        points = [(length, stat.mean, stat.std or 0.0) for length, stat in stats if stat.n]
        if not points:
            continue
        lengths, means, stds = (np.array(v) for v in zip(*points, strict=True))
        style = row_style(index)
        axes.plot(lengths, means, marker="o", label=legend_label(row), **style)
        axes.fill_between(lengths, means - stds, means + stds, color=style["color"], alpha=0.2)
    if group.problem_lengths is not None:  # problem lengths, on a linear axis as Ruoss et al.
        axes.axvspan(*group.problem_lengths, color="grey", alpha=0.15, label="train lengths")
        axes.set_xlabel("problem length")
    else:
        axes.axvline(group.train_seq_len, color="grey", linestyle="--", label="train length")
        axes.set_xscale("log", base=2)
        axes.set_xticks(group.lengths, labels=[str(length) for length in group.lengths])
        axes.set_xlabel(f"evaluation length ({length_unit(group)})")
    axes.set_title(group.title, fontsize="small")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize="small")
    return figure, axes


def position_figure(group: Group) -> Figure:
    """Mean NLL against position in the window at the group's ``position_length`` (log x, each
    bucket at its end position), ± one std shaded, one line per row; the training length
    marked. The same canvas as value_figure."""
    from matplotlib.figure import Figure  # lazily, as in value_figure

    figure = Figure(figsize=FIGURE_INCHES, dpi=FIGURE_DPI)
    axes = figure.add_subplot()
    for index, row in enumerate(group.rows):
        if row.by_position is None:
            continue
        ends = np.array([end for _, end in row.by_position.buckets])
        means = np.array([stat.mean for stat in row.by_position.nll])
        stds = np.array([stat.std or 0.0 for stat in row.by_position.nll])
        style = row_style(index)
        axes.plot(ends, means, marker=".", label=legend_label(row), **style)
        axes.fill_between(ends, means - stds, means + stds, color=style["color"], alpha=0.2)
    axes.axvline(group.train_seq_len, color="grey", linestyle="--", label="train length")
    axes.set_xscale("log", base=2)
    axes.set_xlabel(f"position in the window (bucket end; window {group.position_length} tokens)")
    stats = [stat for row in group.rows if row.by_position for stat in row.by_position.nll]
    axes.set_ylabel("NLL, nats per token" + spread(stats))
    axes.set_title(group.title, fontsize="small")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize="small")
    figure.tight_layout()
    return figure


# ------------------------------------------------------------------------------ TensorBoard


def slug(label: str) -> str:
    """A directory name for a row label: "rope + yarn" -> "rope+yarn"."""
    return re.sub(r"[^\w.+=-]+", "_", label.replace(" + ", "+")).strip("_")


def write_tensorboard(report: Report, directory: Path) -> None:
    """One TensorBoard run per row (per group), its mean perplexity (the report's metric) at
    step = length, so the rows overlay in the Scalars tab."""
    metric = report.metric
    for group in report.groups:
        for row in group.rows:
            with SummaryWriter(log_dir=str(directory / group.name / slug(row.label))) as writer:
                for c in row.cells:
                    if c.value.n:
                        writer.add_scalar(f"report/{metric}", c.value.mean, global_step=c.length)
                    if c.ratio.n:
                        ratio = f"report/{metric}_ratio"
                        writer.add_scalar(ratio, c.ratio.mean, global_step=c.length)
                    if c.accuracy.n:
                        writer.add_scalar("report/accuracy", c.accuracy.mean, global_step=c.length)
                if row.by_position is not None:
                    for (_, end), stat in zip(
                        row.by_position.buckets, row.by_position.nll, strict=True
                    ):
                        writer.add_scalar("report/loss_by_position", stat.mean, global_step=end)
