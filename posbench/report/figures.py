"""A report's figures (matplotlib PNGs, one canvas size for all) and its TensorBoard runs, whose
curves overlay in the Scalars tab."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from torch.utils.tensorboard import SummaryWriter

from posbench.report.groups import Group, Report, Row

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FIGURE_INCHES = (8.0, 5.0)
FIGURE_DPI = 100  # with FIGURE_INCHES: 800 x 500 pixels
TITLE_CHARACTERS = 100  # per line of a figure's title (a group's full setting can be longer)

# matplotlib's ten default colours, then the same ten dashed, dash-dotted and dotted: a sweep
# with more than ten rows (every encoding plus scaled re-evaluations) keeps every line distinct.
LINE_STYLES = ("-", "--", "-.", ":")


def row_style(index: int) -> dict[str, str]:
    """The colour and line style of a group's ``index``-th row, the same in every figure."""
    return {"color": f"C{index % 10}", "linestyle": LINE_STYLES[index // 10 % len(LINE_STYLES)]}


def legend_label(row: Row) -> str:
    """A row's label in a figure's legend, marked when the row is not comparable."""
    return row.label if row.not_comparable is None else f"{row.label} (not comparable)"


def ppl_figure(group: Group) -> Figure:
    """Mean perplexity against evaluation length (log-log), ± one std shaded, one line per
    row; a fixed FIGURE_INCHES x FIGURE_DPI canvas so every report image has the same size."""
    from matplotlib.ticker import StrMethodFormatter  # lazily: only commands that draw

    figure, axes = length_figure(group, "ppl")
    axes.set_yscale("log")
    axes.yaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
    axes.yaxis.set_minor_formatter(StrMethodFormatter("{x:g}"))
    axes.set_ylabel("perplexity (mean ± std over seeds)")
    figure.tight_layout()  # arranges the axes inside the fixed canvas; the size stays
    return figure


def accuracy_figure(group: Group) -> Figure:
    """A task's mean accuracy on the answer bytes against evaluation length, as ppl_figure."""
    figure, axes = length_figure(group, "accuracy")
    axes.set_ylim(0, 1)
    axes.set_ylabel("accuracy on the answer bytes (mean ± std over seeds)")
    figure.tight_layout()
    return figure


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
    axes.axvline(group.train_seq_len, color="grey", linestyle="--", label="train length")
    axes.set_xscale("log", base=2)
    axes.set_xticks(group.lengths, labels=[str(length) for length in group.lengths])
    axes.set_xlabel("evaluation length (tokens)")
    axes.set_title(textwrap.fill(group.title, TITLE_CHARACTERS), fontsize="small")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize="small")
    return figure, axes


def position_figure(group: Group) -> Figure:
    """Mean NLL against position in the window at the group's ``position_length`` (log x, each
    bucket at its end position), ± one std shaded, one line per row; the training length
    marked. The same canvas as ppl_figure."""
    from matplotlib.figure import Figure  # lazily, as in ppl_figure

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
    axes.set_ylabel("NLL, nats per token (mean ± std over seeds)")
    axes.set_title(textwrap.fill(group.title, TITLE_CHARACTERS), fontsize="small")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize="small")
    figure.tight_layout()
    return figure


# ----------------------------------------------------------------------------- writing


def slug(label: str) -> str:
    """A directory name for a row label: "rope + yarn" -> "rope+yarn"."""
    return re.sub(r"[^\w.+=-]+", "_", label.replace(" + ", "+")).strip("_")


def write_tensorboard(report: Report, directory: Path) -> None:
    """One TensorBoard run per row (per group), its mean perplexity at step = length, so the
    rows overlay in the Scalars tab."""
    for group in report.groups:
        for row in group.rows:
            with SummaryWriter(log_dir=str(directory / group.name / slug(row.label))) as writer:
                for c in row.cells:
                    if c.ppl.n:
                        writer.add_scalar("report/ppl", c.ppl.mean, global_step=c.length)
                    if c.ratio.n:
                        writer.add_scalar("report/ppl_ratio", c.ratio.mean, global_step=c.length)
                    if c.accuracy.n:
                        writer.add_scalar("report/accuracy", c.accuracy.mean, global_step=c.length)
                if row.by_position is not None:
                    for (_, end), stat in zip(
                        row.by_position.buckets, row.by_position.nll, strict=True
                    ):
                        writer.add_scalar("report/loss_by_position", stat.mean, global_step=end)
