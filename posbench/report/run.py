"""A finished run as a report reads it: from its directory (read.py) or from a summary file
(summary.py), which both build it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Run:
    """A finished run: its directory (or ``<summary>/<name>``), its config.yaml flattened and
    its results.json."""

    path: Path
    config: dict[str, Any]  # flat: {"train.seq_len": 128, ...}
    results: dict[str, Any]
