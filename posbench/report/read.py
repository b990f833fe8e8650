"""Finding the runs below a directory (or in a summary file) and reading each one, or the reason
it is left out."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from posbench.config import flat_config
from posbench.errors import PosbenchError
from posbench.report.summary import is_summary, read_summary
from posbench.runs import CONFIG_FILE, RESULTS_FILE, read_results

MISSING_RESULTS = "no results.json (failed, interrupted or still running)"


@dataclass(frozen=True)
class Run:
    """A finished run: its directory, its config.yaml flattened and its results.json."""

    path: Path
    config: dict[str, Any]  # flat: {"train.seq_len": 128, ...}
    results: dict[str, Any]


@dataclass(frozen=True)
class Excluded:
    """A run directory left out of the report, and why (unfinished, diverged, unreadable)."""

    path: Path
    reason: str


def find_runs(roots: Sequence[Path], skip: Path | None = None) -> tuple[list[Run], list[Excluded]]:
    """Every run directory below each of ``roots`` (not descending into runs, hidden
    directories or ``skip``; a run below two roots counted once), split into runs to report
    and runs excluded with the reason. A root that is a summary file (summary.py) gives the
    runs it holds."""
    runs, excluded, seen = [], [], set()
    skipped = None if skip is None else skip.resolve()
    for root in roots:
        if is_summary(root):
            runs += [Run(path, config, results) for path, config, results in read_summary(root)]
            continue
        for directory, subdirs, files in os.walk(root):
            path = Path(directory)
            resolved = path.resolve()
            if resolved == skipped:
                subdirs.clear()
                continue
            subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
            if RESULTS_FILE in files or CONFIG_FILE in files or (path / ".hydra").is_dir():
                subdirs.clear()
                if resolved in seen:
                    continue
                seen.add(resolved)
                run = read_run(path)
                (runs if isinstance(run, Run) else excluded).append(run)
    return runs, excluded


def read_run(path: Path) -> Run | Excluded:
    try:
        results = read_results(path)
    except PosbenchError as err:
        return Excluded(path, str(err))
    if not results:
        return Excluded(path, MISSING_RESULTS)
    status = results.get("status") or "ok"  # results.json before issue 5 has no status
    if status != "ok":
        step = results.get("train", {}).get("diverged_at_step")
        return Excluded(path, status + (f" at step {step}" if step is not None else ""))
    if "eval" not in results:
        return Excluded(path, f"{RESULTS_FILE} holds no evaluation records")
    if not (path / CONFIG_FILE).is_file():
        return Excluded(path, f"no {CONFIG_FILE}: not a posbench run")
    return Run(path, flat_config(OmegaConf.load(path / CONFIG_FILE)), results)
