"""A run summary read once for the renderers: its runs' report and provenance."""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from posbench.report.groups import Group, Report, Row, build_report
from posbench.report.read import Run
from posbench.report.styles import ENCODING_STYLES
from posbench.report.summary import read_summary, summary_provenance


@dataclass(frozen=True)
class Source:
    """One summary, read once: its runs' report and provenance."""

    name: str  # its path in the repository: results/<experiment>/<name>.json
    path: Path
    report: Report
    runs: list[Run]
    provenance: dict

    @classmethod
    def load(cls, root: Path, name: str) -> Source:
        path = root / name
        runs = read_summary(path)
        return cls(name, path, build_report([path], out=None), runs, summary_provenance(path))

    def main_runs(self) -> set[Path]:
        """The runs of the first sweep the summary was written from (the experiment's own
        command; later sweeps add variants beside it): every run for a summary of one sweep."""
        sweeps = self.provenance.get("sweeps", [])
        if len(sweeps) < 2:
            return {run.path for run in self.runs}
        return {run.path for run in self.runs if run.path.parent.name == sweeps[0]}

    def main_group(self) -> Group:
        """The group that holds the first sweep's runs."""
        main = self.main_runs()
        return next(g for g in self.report.groups if any(set(r.runs) & main for r in g.rows))

    def main_rows(self, group: Group) -> list[Row]:
        """The group's rows of the first sweep's runs, measured as trained."""
        main = self.main_runs()
        return [row for row in group.rows if row.as_trained and set(row.runs) <= main]

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
