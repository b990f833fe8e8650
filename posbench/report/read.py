"""Finding the runs below a directory (or in a summary file) and reading each one, or the reason
it is left out; and the runs that are one run (the same config and seed run again), of which
the newest is kept."""

from __future__ import annotations

import functools
import json
import math
import os
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from posbench.config import EvalConfig, TrainConfig, config_dir, flat_config
from posbench.errors import PosbenchError
from posbench.model.config import ModelConfig
from posbench.report.run import Run
from posbench.report.summary import is_summary, read_summary
from posbench.runs.directory import CONFIG_FILE, RESULTS_FILE
from posbench.runs.results import merge_eval_records, read_results

MISSING_RESULTS = "no results.json (failed, interrupted or still running)"
# Keys that change neither the trained model nor any record's number (where it runs, what it
# logs, where its caches are, how many windows a forward pass holds, whether it is compiled,
# which lengths it scores: a record is one length): runs that differ only in them are one run,
# not two seeds.
BOOKKEEPING = (
    "device",
    "threads",
    "data.cache_dir",
    "train.log_every",
    "train.val_every",
    "train.val_batches",
    "train.checkpoint_every",
    "train.resume",
    "logger",  # where the metrics went
    "eval.batch_size",
    "eval.compile",
    "eval.lengths",
    "eval.task_lengths",
)


@dataclass(frozen=True)
class Duplicate:
    """A run left out because a newer run has its config and seed: ``of``, the one kept."""

    path: Path
    of: Path


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
            runs += read_summary(root)
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


@functools.cache
def schema_defaults() -> dict[str, Any]:
    """The model, train and eval keys' defaults, flat ({"model.attention_scaling": "none",
    ...}): what a run whose config.yaml lacks one of them (written before posbench had it)
    ran with."""
    schemas = (("model", ModelConfig), ("train", TrainConfig), ("eval", EvalConfig))
    return {
        f"{section}.{key}": value
        for section, schema in schemas
        for key, value in flat_config(OmegaConf.structured(schema)).items()
    }


@functools.cache
def defaults_from_other_keys() -> dict[str, str]:
    """The model, train and eval keys whose default in a config group's files is another key's
    value, and that key (every conf/model/*.yaml: ``sigmoid_length: ${train.seq_len}``, so
    {"model.sigmoid_length": "train.seq_len"}): the schema gives them None."""
    found = {}
    for section in ("model", "train", "eval"):
        for path in sorted((config_dir() / section).glob("*.yaml")):
            for key, value in OmegaConf.to_container(OmegaConf.load(path)).items():
                if isinstance(value, str) and (other := re.fullmatch(r"\$\{([\w.]+)\}", value)):
                    found[f"{section}.{key}"] = other[1]
    return found


def identity_config(run: Run) -> dict[str, Any]:
    """What makes a run the run it is: its whole config, seed included, keys it lacks at their
    defaults (one whose default is another key's value, equal to it, is at its default: a run
    from before it existed lacks it), BOOKKEEPING aside."""
    defaults = schema_defaults()
    config = {**defaults, **run.config}
    for key, other in defaults_from_other_keys().items():
        if key in config and other in config and config[key] == config[other]:
            config[key] = defaults.get(key)
    return {key: value for key, value in config.items() if not is_under(key, BOOKKEEPING)}


def is_under(key: str, sections: Sequence[str]) -> bool:
    """Whether the flat ``key`` is one of ``sections`` or inside one ("eval.stride", "eval")."""
    return any(key == section or key.startswith(f"{section}.") for section in sections)


def modified(run: Run) -> float:
    """When the run's results.json was last written; -inf for a run read from a summary file,
    whose path is no directory on disk."""
    try:
        return (run.path / RESULTS_FILE).stat().st_mtime
    except OSError:
        return -math.inf


def drop_duplicates(runs: Sequence[Run]) -> tuple[list[Run], list[Duplicate]]:
    """``runs`` with one run per ``identity_config`` (a run repeated is one seed, not several): the
    newest (results.json's time; among equal times, or runs of a summary file, the last found),
    in the order found, with the records only an older one measured added to its own (a run
    trained again to be measured another way: its eval-time extensions stay beside the other's
    remaps); and the others, each with the run kept."""
    same: dict[str, list[int]] = defaultdict(list)
    for index, run in enumerate(runs):
        same[json.dumps(identity_config(run), sort_keys=True)].append(index)
    kept, duplicates = {}, []
    for indices in same.values():
        oldest_first = sorted(indices, key=lambda i: (modified(runs[i]), i))
        newest = oldest_first[-1]
        results = runs[newest].results
        if len(indices) > 1:  # each newer run's records replace an older one's of their key
            merged: dict[str, Any] = {"eval": []}
            for i in oldest_first:
                merged = merge_eval_records(merged, runs[i].results["eval"])
            results = {**results, "eval": merged["eval"]}
        kept[newest] = replace(runs[newest], results=results)
        duplicates += [Duplicate(runs[i].path, runs[newest].path) for i in indices if i != newest]
    return [kept[i] for i in range(len(runs)) if i in kept], duplicates
