"""A published table: a result kept as the table it was published in, for a result whose runs
are gone and cannot be re-run here (a GPU run's table, typed before summaries existed).

It is the exception to results/'s rule that docs are rendered from per-run records
(summary.py): it holds one number per encoding and length, as published, its provenance (the
command, machine, date and posbench commit that made it, and the page it was copied from) and
``"per_run_records": false``. Re-measuring it replaces it with a summary. Its JSON:

- ``format``: PUBLISHED_FORMAT; ``title``: what the numbers are;
- ``per_run_records``: false;
- ``provenance``: ``commands``, ``machine``, ``date``, ``posbench_commit``, ``source``, and
  ``not_measured`` (encoding -> why the table has no row for it);
- ``metric``, ``train_seq_len``, ``reference`` (posbench/references' table it was read against,
  or null);
- ``at_train_seq_len``: encoding -> its ``metric`` at the training length;
- ``ratios``: encoding -> {evaluation length: its ``metric`` there over at_train_seq_len}.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posbench.errors import PosbenchError

PUBLISHED_FORMAT = "posbench-published-table/1"
PROVENANCE_FIELDS = ("commands", "machine", "date", "posbench_commit", "source", "not_measured")


@dataclass(frozen=True)
class PublishedTable:
    """One published table (the module docstring), its lengths as ints."""

    name: str  # its path in the repository: results/<experiment>/<name>.json
    title: str
    provenance: dict[str, Any]
    metric: str
    train_seq_len: int
    reference: str | None
    at_train_seq_len: dict[str, float]
    ratios: dict[str, dict[int, float]]

    @property
    def lengths(self) -> list[int]:
        return sorted({n for by_length in self.ratios.values() for n in by_length})

    @property
    def experiment(self) -> str:
        return Path(self.name).parent.name


def is_published_table(content: Any) -> bool:
    """Whether a results/ file's JSON ``content`` is a published table."""
    return isinstance(content, dict) and content.get("format") == PUBLISHED_FORMAT


def read_published_table(root: Path, name: str) -> PublishedTable:
    """The published table at ``root / name``; a one-line error where it is not one."""
    path = root / name
    try:
        content = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise not_published(path, error) from None
    return published_table(name, path, content)


def published_table(name: str, path: Path, content: Any) -> PublishedTable:
    """The published table ``content``, read from ``path`` (``name``: below the repository);
    a one-line error where it is not one."""
    try:
        if not is_published_table(content):
            raise ValueError(f'no "format": "{PUBLISHED_FORMAT}"')
        if content["per_run_records"] is not False:
            raise ValueError("per_run_records must be false")
        if missing := [f for f in PROVENANCE_FIELDS if f not in content["provenance"]]:
            raise ValueError(f"its provenance lacks {', '.join(missing)}")
        ratios = {
            encoding: {int(n): float(r) for n, r in by_length.items()}
            for encoding, by_length in content["ratios"].items()
        }
        train = int(content["train_seq_len"])
        if set(ratios) != set(content["at_train_seq_len"]):
            raise ValueError("ratios and at_train_seq_len name different encodings")
        if any(by_length.get(train) != 1.0 for by_length in ratios.values()):
            raise ValueError(f"every ratio at train_seq_len ({train}) must be 1.0")
        return PublishedTable(
            name,
            str(content["title"]),
            dict(content["provenance"]),
            str(content["metric"]),
            train,
            content["reference"],
            {k: float(v) for k, v in content["at_train_seq_len"].items()},
            ratios,
        )
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        raise not_published(path, error) from None


def not_published(path: Path, error: Exception) -> PosbenchError:
    return PosbenchError(
        f"{path} is not a published table ({error}); posbench/report/published.py describes "
        "the format"
    )
