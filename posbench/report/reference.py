"""A sweep read against published numbers (``posbench report DIR --reference NAME``): which of
a group's rows meet the reference's, what the reference says at a row's length, and one line
for each way the sweep and the reference do not match (the Markdown is tables.py's, the figure
figures.py's)."""

from __future__ import annotations

from collections.abc import Sequence

from posbench.report.groups import Group, Report, Row


def compared_rows(group: Group) -> list[Row]:
    """The group's rows that meet its reference table: measured as their runs were trained
    (the protocol of the reference's numbers) and of an encoding the table has, in row order."""
    table = group.reference
    if table is None:
        return []
    return [row for row in group.rows if row.as_trained and row.name in table.values]


def published(group: Group, row: Row, length: int) -> dict[str, float | None]:
    """The reference's ``value`` and ``ratio`` (to the training length) for ``row``'s encoding
    at ``length``: None where it has no number there, or the row does not meet it."""
    table = group.reference
    if table is None or not row.as_trained or row.name not in table.values:
        return {"value": None, "ratio": None}
    return {"value": table.values[row.name].get(length), "ratio": table.ratio(row.name, length)}


def lengths_text(lengths: Sequence[int]) -> str:
    return ", ".join(str(length) for length in lengths)


def reference_warnings(report: Report) -> list[str]:
    """One line for each way the report and its reference do not match: another metric, a
    group trained at a length the reference has no table for, evaluated at other lengths, or
    without a row the reference has numbers for."""
    reference = report.reference
    if reference is None:
        return []
    warnings = []
    if report.metric != reference.metric:
        warnings.append(
            f"{reference.name}'s numbers are {reference.metric}, this report's {report.metric} "
            f"(--metric {report.metric}): their ratios are not the same measure"
        )
    trained = lengths_text([table.train_seq_len for table in reference.tables])
    for group in report.groups:
        subject = group.name or "the sweep"
        table = group.reference
        if table is None:
            warnings.append(
                f"{subject} is trained at {group.train_seq_len} tokens and {reference.name} has "
                f"tables trained at {trained} only: {subject} gets none of its numbers"
            )
            continue
        if group.lengths != table.lengths:
            warnings.append(
                f"{subject} is evaluated at {lengths_text(group.lengths)}, {reference.name}'s "
                f"{table.source} at {lengths_text(table.lengths)}: the tables compare the "
                "lengths both have"
            )
        if not compared_rows(group):
            warnings.append(
                f"{subject} has no run of {', '.join(table.values)} measured as trained: "
                f"nothing to set beside {reference.name}'s {table.source}"
            )
    return warnings
