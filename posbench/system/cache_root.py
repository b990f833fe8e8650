"""Where posbench keeps what outlives a run: the corpus cache (posbench/data/cache.py) and the
registry of running jobs (job_registry.py)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root(cache_dir: str | None) -> Path:
    """``data.cache_dir``, else ``$POSBENCH_CACHE``, else ``$XDG_CACHE_HOME/posbench``."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    if os.environ.get("POSBENCH_CACHE"):
        return Path(os.environ["POSBENCH_CACHE"]).expanduser()
    return xdg_cache_home() / "posbench"


def xdg_cache_home() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
