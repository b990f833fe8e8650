"""How a report prints a statistic: a mean (± std) to two decimals, the best of a column in
bold (tables.py, generalization.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from posbench.report.cells import Stat


def stat_text(stat: Stat, best: str | None = None) -> str:
    """The mean (± std) to two decimals, in bold where it prints as ``best`` (best_shown)."""
    mean = f"{stat.mean:.2f}"
    if mean == best:
        mean = f"**{mean}**"
    return mean if stat.std is None else f"{mean} ± {stat.std:.2f}"


def best_shown(means: Iterable[float | None], best_of: Any = max) -> str | None:
    """The best of ``means`` as a table prints it, so that every mean printed alike is bold (a
    0.004 over a 0.001 is no win: both print 0.00); None, no bold, where fewer than two were
    measured or all print alike."""
    printed = {f"{m:.2f}": m for m in means if m is not None}
    if len(printed) < 2:
        return None
    return f"{best_of(printed.values()):.2f}"
