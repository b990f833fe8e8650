"""Run and sweep directories that no two jobs share, even when they start in the same second.

Hydra names output directories after the current time to the second, so two trainings
started together (two terminals, a script, two sweeps) would write into one directory and
overwrite each other's weights and results. conf/config.yaml therefore wraps its directory
names in ``${unique_dir:...}``, which *creates* the directory with ``os.mkdir``: mkdir is
atomic (also on NFS), so of several processes asking for the same name exactly one gets it
and the others get ``<name>_2``, ``<name>_3``, ... Unlike pid + microsecond names, this keeps
names readable and holds across hosts that share a file system.

Within a sweep, each job's subdirectory names what sets it apart: its number, encoding and
seed, and ``${random_positions_suffix:${train.random_positions}}`` adds the randomized
positions a job trains at, so that a randomized-positions sweep writes beside the plain one in
one sweep directory (both number their jobs from 0) instead of into the same directories.
``${sweep_dir:}`` names the directory of the sweep a job runs in, so that a job of a later sweep
in it can name an earlier sweep's run (``+experiment=drope``'s recalibration, its RoPE phase).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

RESOLVER = "unique_dir"
SUFFIX_RESOLVER = "random_positions_suffix"
SWEEP_RESOLVER = "sweep_dir"
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


def random_positions_suffix(random_positions: int | None) -> str:
    """``_random<N>`` for a job trained at train.random_positions=N, nothing for one trained at
    consecutive positions."""
    return "" if random_positions is None else f"_random{random_positions}"


def current_sweep_dir() -> str:
    """The directory of the sweep this job runs in; "." outside a sweep's job (a config being
    composed or checked before the sweep starts, or a single run)."""
    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        return str(HydraConfig.get().sweep.dir)
    return "."


def register_output_dir_resolvers() -> None:
    """Make ``${unique_dir:PATH}``, ``${random_positions_suffix:N}`` and ``${sweep_dir:}``
    available to configs (idempotent).

    ``use_cache``: Hydra reads hydra.run.dir / hydra.sweep.dir several times per job and
    copies the cache into every sweep job's config (also into launcher worker processes), so
    each job claims its directory once and all jobs of a sweep share one sweep directory.
    """
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, claim_unique_dir, use_cache=True)
    if not OmegaConf.has_resolver(SUFFIX_RESOLVER):
        OmegaConf.register_new_resolver(SUFFIX_RESOLVER, random_positions_suffix)
    if not OmegaConf.has_resolver(SWEEP_RESOLVER):
        OmegaConf.register_new_resolver(SWEEP_RESOLVER, current_sweep_dir)


def names_new_dir(node: DictConfig, key: str) -> bool:
    """Whether ``node[key]`` is a ``${unique_dir:...}`` directory: one that no run has written
    yet (read without claiming it)."""
    value = OmegaConf.to_container(node, resolve=False)[key]
    return isinstance(value, str) and value.startswith("${" + RESOLVER + ":")


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
