"""A run summary read once for the renderers: its runs' report and provenance."""

from __future__ import annotations

import re
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posbench.report.groups import Group, Report, Row, report_of
from posbench.report.read import Run
from posbench.report.styles import ENCODING_STYLES
from posbench.report.summary import (
    check_summary,
    provenance_parts,
    summary_runs,
    summary_sweeps,
)


@dataclass(frozen=True)
class Source:
    """One summary, read once: its runs' report and provenance."""

    name: str  # its path in the repository: results/<experiment>/<name>.json
    path: Path
    report: Report
    runs: list[Run]
    provenance: dict

    @classmethod
    def of(cls, name: str, path: Path, content: dict[str, Any]) -> Source:
        """The summary ``content`` read from ``path`` (``name``: its path in the repository)."""
        check_summary(path, content)
        runs = summary_runs(path, content)
        return cls(name, path, report_of(runs, [], [path]), runs, content["provenance"])

    def main_runs(self) -> set[Path]:
        """The runs of the first sweep the summary was written from (the experiment's own
        command; later sweeps add variants beside it): every run for a summary of one sweep."""
        sweeps = summary_sweeps(self.provenance)
        if len(sweeps) < 2:
            return {run.path for run in self.runs}
        return {run.path for run in self.runs if run.path.parent.name == sweeps[0]}

    def main_group(self) -> Group:
        """The group that holds the first sweep's runs."""
        main = self.main_runs()
        return next(g for g in self.report.groups if any(set(r.runs) & main for r in g.rows))

    def main_rows(self, group: Group) -> list[Row]:
        """The group's rows measured as trained: of the first sweep's runs, and of a later
        sweep's runs of an encoding the first has not, run as the experiment runs it (a row
        of its own name, no option or randomized positions telling it from another: e.g.
        ``encoding=pope,path`` added later). Other rows of later sweeps (RoPE's options,
        randomized positions) are variants beside the main ones."""
        main = self.main_runs()
        first = {row.name for row in group.rows if set(row.runs) <= main}
        return [
            row
            for row in group.rows
            if row.as_trained
            and (set(row.runs) <= main or (row.name not in first and row.label == row.name))
        ]

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


def provenance_line(source: Source, commands: str | None = None) -> str:
    """How the summary's runs were made: per writing (provenance_parts: the experiment's own
    sweep, then each sweep added later), the command (or ``commands``: part_text), how many
    runs, the commit, the machine, the date and the wall time."""
    parts = provenance_parts(source.provenance)
    first, *added = (part_text(part, commands) for part in parts)
    later = "".join(f"; then {text}" for text in added)
    return f"{first}{later}; summary: `{source.name}`."


# A re-evaluation's run directory (``posbench eval --run DIR``): the part that differs from
# one run of a sweep to the next.
RUN_ARGUMENT = re.compile(r"(--run[ =])\S+")


def commands_text(commands: list[str | None]) -> str:
    """The recorded ``commands`` as code, joined by "and": a re-evaluation of many runs (the
    same ``posbench eval`` but its ``--run``) once, with ``--run <run>`` and how many runs."""
    counts = Counter(
        RUN_ARGUMENT.sub(r"\1<run>", c) if c.startswith("posbench eval") else c
        for c in filter(None, commands)
    )  # in the order first met
    return " and ".join(
        f"`{command}`" + (f" ({count} runs)" if count > 1 else "")
        for command, count in counts.items()
    )


def part_text(part: dict[str, Any], commands: str | None = None) -> str:
    """One writing of a summary's runs (provenance_parts) in words; ``commands``: what they
    ran, in words, where the recorded commands are not all (provenance's are the last sweep's
    in a directory that held two)."""
    if commands is None:
        commands = commands_text(part["commands"]) or "(command not recorded)"
    commits = [c[:7] for c in part["posbench_commits"] if c != "None"]
    at = f" at {', '.join(commits)}" if commits else ""
    minutes = (
        f", {part['wall_s'] / 60:.0f} min from the first job's start to the last result"
        if part["wall_s"]
        else ""
    )
    machine = f" on {part['machine']}" if part["machine"] else ""  # None: the runs did not say
    return f"{part['runs']} runs of {commands}{at}{machine}, {part['date']}{minutes}"
