"""A report's figures (matplotlib PNGs: each row in the colour and marker of its encoding,
styles.py; one panel per family of encodings past PANEL_CURVES curves; the legend outside the
data, on a canvas widened to hold it) and its TensorBoard runs, whose curves overlay in the
Scalars tab."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from torch.utils.tensorboard import SummaryWriter

from posbench.references import Reference
from posbench.report.cells import Stat
from posbench.report.groups import Group, Report, Row
from posbench.report.reference import compared_rows
from posbench.report.styles import (
    PANEL_CURVES,
    family_order,
    family_rows,
    row_styles,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# The canvas of a figure of one axes before its legend widens it (outside_legend).
FIGURE_INCHES = (8.0, 5.0)
FIGURE_DPI = 100  # with FIGURE_INCHES: 800 x 500 pixels
PANEL_INCHES = (4.5, 3.4)  # of each panel, where a figure has several (rows_figure)
PANEL_MARGIN = 0.8  # inches below and above the panels: the shared x label, the title
LEGEND_MARGIN = 0.2  # inches beside the legend, between it and the panels and at the edge
LEGEND_STEP = 0.25  # inches: the canvas widens for its legend by whole steps
CLOSE_LENGTHS = 1.6  # a panel slants the labels of evaluation lengths closer than this ratio
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
    "longppl": "LongPPL (key tokens)",
}

Points = tuple[np.ndarray, np.ndarray, np.ndarray]  # a curve's x, mean and std


@dataclass
class Drawn:
    """A group's rows drawn (rows_figure): the figure, each panel's axes with its rows, and
    each row's style by id."""

    figure: Figure
    panels: list[tuple[Any, list[Row]]]
    styles: dict[int, dict[str, Any]]

    @property
    def axes(self) -> list[Any]:
        return [axes for axes, _ in self.panels]

    @property
    def labels(self) -> list[str]:
        """The rows' legend labels, in the order drawn."""
        return list(dict.fromkeys(legend_label(row) for _, rows in self.panels for row in rows))

    def holding(self, encoding: str) -> Any:
        """The axes of the first panel with a row of ``encoding`` (else the first)."""
        held = (axes for axes, rows in self.panels if any(row.name == encoding for row in rows))
        return next(held, self.axes[0])


Panels = Callable[[list[Row]], list[tuple[str, list[Row]]]]  # rows -> (title, rows) per panel


def rows_figure(
    group: Group,
    points: Callable[[Row], Points | None],
    more: int = 0,
    marker_size: float = 6.0,
    panels_of: Panels | None = None,
    styles_of: Callable[[Sequence[Row]], list[dict[str, Any]]] = row_styles,
) -> Drawn:
    """One curve per row that has ``points``, ± one std shaded, in the row's style (row_styles
    over the group's rows: the same in each of the group's figures), rows in family_order:
    one axes on FIGURE_INCHES, or past PANEL_CURVES curves (``more``: those the caller adds)
    one panel per family (family_rows), or per ``panels_of``'s split, axes shared; titled by
    the group; ``styles_of``: the rows' styles (row_styles, or variant_colour_styles)."""
    curves = {id(row): p for row in group.rows if (p := points(row)) is not None}
    rows = family_order([row for row in group.rows if id(row) in curves])
    styles = dict(zip(map(id, group.rows), styles_of(group.rows), strict=True))
    panels = family_rows(rows) if len(rows) + more > PANEL_CURVES else [("", rows)]
    if panels_of is not None and len(rows) + more > PANEL_CURVES:
        panels = panels_of(rows)
    figure, grid = canvas(len(panels))
    for axes, (family, members) in zip(grid, panels, strict=True):
        for row in members:
            x, mean, std = curves[id(row)]
            style = styles[id(row)]
            axes.plot(x, mean, label=legend_label(row), markersize=marker_size, **style)
            axes.fill_between(x, mean - std, mean + std, color=style["color"], alpha=0.15, lw=0)
        axes.grid(True, which="both", alpha=0.3)
        if len(panels) > 1:
            axes.set_title(family, fontsize="medium")
    if len(panels) > 1:
        figure.suptitle(group.title, fontsize="medium")
    else:
        grid[0].set_title(group.title, fontsize="small")
    drawn = [(axes, rows) for axes, (_, rows) in zip(grid, panels, strict=True)]
    return Drawn(figure, drawn, styles)


def canvas(panels: int) -> tuple[Figure, list[Any]]:
    """A figure of ``panels`` axes before its legend: one on FIGURE_INCHES, or two columns of
    PANEL_INCHES each sharing both axes (a spare slot hidden, the panel above it labelling its
    x ticks), PANEL_MARGIN more for the titles and axis labels."""
    # matplotlib takes a second to import: only commands that draw pay for it
    from matplotlib.figure import Figure

    if panels == 1:
        figure = Figure(figsize=FIGURE_INCHES, dpi=FIGURE_DPI, layout="constrained")
        return figure, [figure.add_subplot()]
    columns = min(panels, 2)
    lines = math.ceil(panels / columns)
    size = (PANEL_INCHES[0] * columns, PANEL_INCHES[1] * lines + PANEL_MARGIN)
    figure = Figure(figsize=size, dpi=FIGURE_DPI, layout="constrained")
    grid = list(figure.subplots(lines, columns, sharex=True, sharey=True, squeeze=False).flat)
    for index in range(panels, len(grid)):
        grid[index].set_visible(False)
        grid[index - columns].xaxis.set_tick_params(labelbottom=True)
    return figure, grid[:panels]


def outside_legend(
    figure: Figure, axes: Sequence[Any], title: str | None = None, first: Sequence[str] = ()
) -> Any:
    """One legend for every axes, right of them outside the data: each label once, those in
    ``first`` leading in that order, the others as drawn; two columns where one would be
    taller than the canvas. The canvas widens by the legend's width in whole LEGEND_STEPs, so
    the axes keep their size and the image's size follows from the labels alone."""
    entries: dict[str, Any] = {}
    for each in axes:
        for handle, label in zip(*each.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    labels = sorted(entries, key=lambda x: first.index(x) if x in first else len(first))
    width, height = figure.get_size_inches()
    for columns in (1, 2):
        legend = figure.legend(
            [entries[label] for label in labels],
            labels,
            loc="outside right center",
            fontsize="small",
            ncols=columns,
            title=title,
            title_fontsize="small",
        )
        box = legend.get_window_extent()
        if columns == 2 or box.height < 0.95 * height * figure.dpi:
            break
        legend.remove()
    wider = math.ceil((box.width / figure.dpi + LEGEND_MARGIN) / LEGEND_STEP) * LEGEND_STEP
    figure.set_size_inches(width + wider, height)
    return legend


def length_axis(group: Group, axes: Sequence[Any]) -> str:
    """Each axes's x axis of evaluation lengths (log, the training length marked) or of problem
    lengths (linear, the trained range shaded, as Ruoss et al.); return its label."""
    lengths = group.lengths
    # a panel is narrow: labels of lengths closer than CLOSE_LENGTHS times slant, not overlap
    close = any(b < CLOSE_LENGTHS * a for a, b in pairwise(lengths))
    for each in axes:
        if group.problem_lengths is not None:
            each.axvspan(*group.problem_lengths, color="grey", alpha=0.15, label="train lengths")
        else:
            each.axvline(group.train_seq_len, color="grey", linestyle="--", label="train length")
            each.set_xscale("log", base=2)
            each.set_xticks(lengths, labels=[str(length) for length in lengths])
            if close and len(axes) > 1:
                each.tick_params(axis="x", labelrotation=45)
    if group.problem_lengths is not None:
        return "problem length"
    return f"evaluation length ({length_unit(group)})"


def finish(
    drawn: Drawn, xlabel: str, ylabel: str, title: str | None = None, after: Sequence[str] = ()
) -> Figure:
    """The axis labels (the panels' shared ones beside them) and the legend outside, titled
    ``title``: the rows first, then the labels ``after``, then the marks of the x axis."""
    if len(drawn.axes) == 1:
        drawn.axes[0].set_xlabel(xlabel)
        drawn.axes[0].set_ylabel(ylabel)
    else:
        drawn.figure.supxlabel(xlabel, fontsize="medium")
        drawn.figure.supylabel(ylabel, fontsize="medium")
    outside_legend(drawn.figure, drawn.axes, title, [*drawn.labels, *after])
    return drawn.figure


def cell_points(name: str) -> Callable[[Row], Points | None]:
    """A row's curve of its cells' ``name`` Stat (value, ratio, accuracy) against length."""

    def points(row: Row) -> Points | None:
        found = [(c.length, s.mean, s.std or 0.0) for c in row.cells if (s := getattr(c, name)).n]
        return tuple(np.array(v) for v in zip(*found, strict=True)) if found else None

    return points


def value_figure(
    group: Group,
    metric: str = "ppl",
    panels_of: Panels | None = None,
    styles_of: Callable[[Sequence[Row]], list[dict[str, Any]]] = row_styles,
) -> Figure:
    """The cells' mean ``metric`` (perplexity by default) against evaluation length (log x),
    ± one std shaded, one line per row (in panels and styles as rows_figure draws them); the y
    axis linear or log (LOG_SCALE_RATIO), its labelled ticks covering every curve and its
    shading."""
    drawn = rows_figure(group, cell_points("value"), panels_of=panels_of, styles_of=styles_of)
    stats = [c.value for row in group.rows for c in row.cells if c.value.n]
    cover_values(drawn.axes[0], [value for stat in stats for value in shaded(stat)])
    return finish(drawn, length_axis(group, drawn.axes), METRIC_AXES[metric] + spread(stats))


def cover_values(axes: Any, values: list[float]) -> None:
    """A y axis, linear or log (LOG_SCALE_RATIO), whose labelled ticks cover ``values`` (the
    curves and their shading; a log axis shows only those > 0); shared axes follow."""
    from matplotlib.ticker import NullFormatter, StrMethodFormatter  # lazily, as canvas

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
    value_figure draws values, with the ratios of ``reference``'s table for each encoding that
    meets it (dotted, 'x' marked, in the colour of its encoding, in the panel of its rows): the
    shapes side by side, where the values of another model are not comparable."""
    table = group.reference
    assert table is not None, "a group read against a reference has its table"
    met = list(dict.fromkeys(row.name for row in compared_rows(group)))
    drawn = rows_figure(group, cell_points("ratio"), more=len(met))
    paper = []
    for name in met:
        lengths, ratios = (np.array(v) for v in zip(*table.ratio_points(name), strict=True))
        colour = next(drawn.styles[id(row)]["color"] for row in group.rows if row.name == name)
        drawn.holding(name).plot(
            lengths, ratios, color=colour, linestyle=":", marker="x", label=f"{name} (paper)"
        )
        paper += ratios.tolist()
    stats = [c.ratio for row in group.rows for c in row.cells if c.ratio.n]
    cover_values(drawn.axes[0], [value for stat in stats for value in shaded(stat)] + paper)
    ylabel = f"{METRIC_AXES[metric]}, ratio to {group.train_seq_len}" + spread(stats)
    title = f"paper: {reference.name}, {table.source}"
    papers = [f"{name} (paper)" for name in met]
    return finish(drawn, length_axis(group, drawn.axes), ylabel, title, papers)


def shaded(stat: Stat) -> tuple[float, float, float]:
    """The mean of a curve's point and the two ends of its shading."""
    std = stat.std or 0.0
    return stat.mean - std, stat.mean, stat.mean + std


def accuracy_figure(group: Group) -> Figure:
    """A task's mean accuracy on the answer bytes against evaluation length, as value_figure."""
    drawn = rows_figure(group, cell_points("accuracy"))
    drawn.axes[0].set_ylim(0, 1)
    stats = [c.accuracy for row in group.rows for c in row.cells]
    ylabel = "accuracy on the answer bytes" + spread(stats)
    return finish(drawn, length_axis(group, drawn.axes), ylabel)


def length_unit(group: Group) -> str:
    """What a group's lengths count: tokens, of each row's tokenizer where its runs differ in
    theirs (a token of one is not one of another)."""
    if len(group.tokenizers) > 1:
        return f"tokens of each row's tokenizer: {', '.join(group.tokenizers)}"
    return "tokens"


def position_points(row: Row) -> Points | None:
    """A row's mean NLL per position bucket, at each bucket's end position."""
    if row.by_position is None:
        return None
    ends = np.array([end for _, end in row.by_position.buckets])
    means = np.array([stat.mean for stat in row.by_position.nll])
    return ends, means, np.array([stat.std or 0.0 for stat in row.by_position.nll])


def position_figure(group: Group) -> Figure:
    """Mean NLL against position in the window at the group's ``position_length`` (log x, each
    bucket at its end position), ± one std shaded, one line per row (small markers: buckets
    are many); the training length marked."""
    drawn = rows_figure(group, position_points, marker_size=3.5)
    for axes in drawn.axes:
        axes.axvline(group.train_seq_len, color="grey", linestyle="--", label="train length")
        axes.set_xscale("log", base=2)
    xlabel = f"position in the window (bucket end; window {group.position_length} tokens)"
    stats = [stat for row in group.rows if row.by_position for stat in row.by_position.nll]
    return finish(drawn, xlabel, "NLL, nats per token" + spread(stats))


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
