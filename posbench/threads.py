"""How many CPU threads a run computes with (the ``threads`` config key).

PyTorch starts one OpenMP thread per core it may use. Two jobs started side by side then run
twice as many busy threads as there are cores, and they thrash (issue 9, on 2 cores: two such
jobs took 5.4x the time of running them one after the other; with one thread each, the pair
was 1.2x faster than serial). So ``threads=auto`` gives each job its share: the cores this
process may use divided by the posbench jobs that run at once by construction (a joblib
sweep's workers, torchrun's local ranks). Jobs started by hand from the shell cannot be
counted: pass ``threads=1`` to each (docs/experiments.md, "Launchers"); the busy-machine
warning says so.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig

log = logging.getLogger(__name__)

AUTO = "auto"
JOBLIB_LAUNCHER = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"


@dataclass(frozen=True)
class Threads:
    """The threads a run computes with, and where the number came from."""

    threads: int
    cores: int  # CPU cores this process may use
    jobs: int  # posbench jobs running at once by construction, this one included
    setting: int | str  # the ``threads`` config value: AUTO or an int

    def describe(self) -> str:
        """``threads 1 (auto: 2 cores / 2 jobs at once)`` or ``threads 4 (set; 2 cores)``."""
        if self.setting == AUTO:
            jobs = f"{self.jobs} jobs" if self.jobs > 1 else "1 job"
            return f"threads {self.threads} (auto: {self.cores} cores / {jobs} at once)"
        return f"threads {self.threads} (set; {self.cores} cores)"


def is_threads_setting(value: Any) -> bool:
    """``auto`` or a positive int (a bool is not a count)."""
    return value == AUTO or (type(value) is int and value > 0)


def available_cores() -> int:
    """CPU cores this process may run on: its affinity mask (taskset, a cgroup cpuset, SLURM),
    which can be fewer than the machine has."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1  # macOS and Windows have no affinity masks


def joblib_workers(n_jobs: int | None) -> int:
    """How many workers joblib runs for ``n_jobs``, read the way joblib's loky backend reads it:
    n > 0 workers; -1 one per CPU joblib sees, -2 all but one, ...; None one."""
    if n_jobs is None:
        return 1
    if n_jobs < 0:
        import joblib  # present whenever the joblib launcher is

        return max(joblib.cpu_count() + 1 + n_jobs, 1)
    return n_jobs


def jobs_at_once(launcher: Mapping[str, Any] | None, environ: Mapping[str, str]) -> int:
    """posbench jobs that run at the same time as this one by construction, this one included:
    the local ranks under torchrun (``LOCAL_WORLD_SIZE``), ``hydra.launcher.n_jobs`` workers
    under Hydra's joblib launcher (``launcher`` is the ``hydra.launcher`` node), else 1."""
    if environ.get("LOCAL_WORLD_SIZE"):
        return max(1, int(environ["LOCAL_WORLD_SIZE"]))
    if launcher is not None and launcher.get("_target_") == JOBLIB_LAUNCHER:
        return max(1, joblib_workers(launcher.get("n_jobs")))
    return 1


def hydra_launcher() -> Mapping[str, Any] | None:
    """The running Hydra job's ``hydra.launcher`` node; None outside a Hydra job (the API)."""
    return HydraConfig.get().launcher if HydraConfig.initialized() else None


def resolve_threads(setting: int | str, cores: int, jobs: int) -> int:
    """``auto``: this job's share of the cores, at least 1; an int is taken as given."""
    assert is_threads_setting(setting), setting
    return max(1, cores // jobs) if setting == AUTO else int(setting)


def machine_busy(load: float, threads: Threads) -> bool:
    """Whether other work already holds cores this job's threads need.

    The 1-minute load average counts runnable threads, this run's own construction among them:
    its ``jobs`` concurrent jobs (siblings, and the earlier jobs of a reused worker) account for
    up to ``jobs * threads``. Only load beyond that is other work, and it leaves this job fewer
    cores than it uses once the total exceeds the cores: load > max(cores, jobs * threads).
    """
    return load > max(threads.cores, threads.jobs * threads.threads)


def one_minute_load() -> float | None:
    """The 1-minute load average; None where the platform has none (Windows)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def use_threads(setting: int | str, environ: Mapping[str, str] = os.environ) -> Threads:
    """Resolve ``setting`` for this process, apply it with ``torch.set_num_threads`` and log it.

    Only the intra-op pool is set: posbench runs no inter-op parallel work (no torch.jit.fork),
    and that pool can be sized once per process only, which a second run in the same process
    (tests, notebooks) would trip over. Hugging Face ``tokenizers`` (encoding a corpus) sizes
    its own pool from ``RAYON_NUM_THREADS`` when it first encodes in parallel: set here unless
    the user set it.
    """
    cores = available_cores()
    jobs = jobs_at_once(hydra_launcher(), environ)
    threads = Threads(resolve_threads(setting, cores, jobs), cores, jobs, setting)
    torch.set_num_threads(threads.threads)
    os.environ.setdefault("RAYON_NUM_THREADS", str(threads.threads))
    log.info(threads.describe())
    return threads


def warn_if_busy(
    threads: Threads, load_average: Callable[[], float | None] = one_minute_load
) -> None:
    """One warning line when other work already holds cores ``threads`` needs (machine_busy)."""
    load = load_average()
    if load is not None and machine_busy(load, threads):
        log.warning(
            "the machine is busy: 1-min load average %.1f on %d cores, more than this run's "
            "%d job(s) x %d thread(s) explain; jobs run side by side should share the cores: "
            "threads=1 each, or threads=N with N x jobs <= %d",
            load,
            threads.cores,
            threads.jobs,
            threads.threads,
            threads.cores,
        )
