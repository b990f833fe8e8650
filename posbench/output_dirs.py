"""Run and sweep directories that no two jobs share, even when they start in the same second.

Hydra names output directories after the current time to the second, so two trainings
started together (two terminals, a script, two sweeps) would write into one directory and
overwrite each other's weights and results. conf/config.yaml therefore wraps its directory
names in ``${unique_dir:...}``, which *creates* the directory with ``os.mkdir``: mkdir is
atomic (also on NFS), so of several processes asking for the same name exactly one gets it
and the others get ``<name>_2``, ``<name>_3``, ... Unlike pid + microsecond names, this keeps
names readable and holds across hosts that share a file system.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from omegaconf import OmegaConf

RESOLVER = "unique_dir"
_claiming = True  # False inside unclaimed()


def claim_unique_dir(path: str) -> str:
    """Create the new, empty directory ``path`` (``path_2``, ``path_3``, ... when taken) and
    return its name (inside ``unclaimed()``: ``path`` itself, nothing created)."""
    requested = Path(path)
    if not _claiming:
        return path
    requested.parent.mkdir(parents=True, exist_ok=True)
    candidate, n = requested, 1
    while True:
        try:
            candidate.mkdir()
            return str(candidate)
        except FileExistsError:
            n += 1
            candidate = requested.with_name(f"{requested.name}_{n}")


def register_unique_dir_resolver() -> None:
    """Make ``${unique_dir:PATH}`` available to configs (idempotent).

    ``use_cache``: Hydra reads hydra.run.dir / hydra.sweep.dir several times per job and
    copies the cache into every sweep job's config (also into launcher worker processes), so
    each job claims its directory once and all jobs of a sweep share one sweep directory.
    """
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, claim_unique_dir, use_cache=True)


@contextmanager
def unclaimed() -> Iterator[None]:
    """Inside, ``${unique_dir:PATH}`` reads as PATH and creates nothing: for checks that look
    at a config's output directory before Hydra runs the job (which then claims it)."""
    global _claiming
    _claiming = False
    try:
        yield
    finally:
        _claiming = True
