"""How many CPU threads a run computes with (the ``threads`` config key), and how
``threads=auto`` adapts that count while training.

PyTorch starts one OpenMP thread per core it may use, and a thread waits at every barrier for
the slowest one: a thread the scheduler parks behind another process's work stalls the whole
step. Two jobs started side by side with every core each thrash (issue 9, on 2 cores: 5.4x the
time of running them one after the other; with one thread each, the pair was 1.2x faster than
serial), and so does a job started next to anything else that keeps a core busy (issue 27: a
default run beside a one-thread job trained at 0.34x its quiet tokens/s).

So ``threads=auto`` takes what the machine has free: the cores this process may use (its
affinity mask, capped by its cgroup's CPU quota), less the cores other processes keep busy
(measured from CPU time, cpu_load.py) or other posbench jobs hold (their threads in the
job registry, job_registry.py), whichever is more, divided among the posbench jobs run
at once by construction (a joblib sweep's workers, torchrun's local ranks, which count each
other here and not through the registry); at least 1.

While training, ``ThreadController`` watches the step times of an ``auto`` run: when steps
slow down sharply against its own recent steps on a machine that was not oversubscribed, and
the machine is oversubscribed now, it drops to the threads the machine has free, and raises
the count again (never above the job's share) once cores are free. Each change is one log line
and a record in results.json's ``train.thread_changes``. A count the user set is never changed.
Changing the count changes floating-point sums in their last bits (torch's CPU kernels split
reductions by thread), so an ``auto`` run that adapted reproduces to about 1e-7, not exactly;
``threads=N`` reproduces exactly.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig

from posbench.system.cpu_load import (
    ROOT,
    CpuLoad,
    CpuMeter,
    affinity_cpus,
    cgroup_quota,
    measure_load,
)
from posbench.system.job_registry import Job, JobRegistry, registered, this_job

log = logging.getLogger(__name__)

AUTO = "auto"
JOBLIB_LAUNCHER = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"

# The controller checks once a window holds CHECK_MIN_STEPS steps and CHECK_SECONDS of them:
# often enough to react within seconds, rarely enough that reading /proc costs nothing.
CHECK_SECONDS = 2.0
CHECK_MIN_STEPS = 5
# "Sharply slower": the median step of a window against the last not-oversubscribed window at
# the same thread count. Oversubscribed OpenMP steps slow by 2-3x (issue 27); noise, a few %.
SLOWDOWN = 1.5
# Consecutive checks that must agree before the count changes without a slowdown to show for it
# (more threads on free cores; fewer on a machine oversubscribed since the count was taken).
AGREEING_CHECKS = 2
# Against flapping (a load that comes and goes every few seconds): a rise undone by the next
# change, a drop, doubles the checks the next rise waits for, up to this many (about a minute).
MAX_RISE_CHECKS = 32


@dataclass(frozen=True)
class Threads:
    """The threads a run computes with, and where the number came from."""

    threads: int
    cores: int  # CPU cores this process may use (affinity mask and cgroup quota)
    jobs: int  # posbench jobs running at once by construction, this one included
    setting: int | str  # the ``threads`` config value: AUTO or an int
    free: int  # cores free of other work (other processes, other posbench jobs) at the start

    def describe(self) -> str:
        """``threads 1 (auto: 1 of 2 cores free / 1 job at once)`` or ``threads 4 (set; 2
        cores)``."""
        if self.setting == AUTO:
            jobs = f"{self.jobs} jobs" if self.jobs > 1 else "1 job"
            cores = f"{self.cores} cores"
            if self.free < self.cores:
                cores = f"{self.free} of {cores} free"
            return f"threads {self.threads} (auto: {cores} / {jobs} at once)"
        return f"threads {self.threads} (set; {self.cores} cores)"

    @property
    def oversubscribed_by_others(self) -> bool:
        """Whether this run's threads need cores that other work holds. A sweep that runs more
        workers than there are cores oversubscribes them itself: its own choice."""
        return self.free < self.cores and self.threads * self.jobs > self.free


def is_threads_setting(value: Any) -> bool:
    """``auto`` or a positive int (a bool is not a count)."""
    return value == AUTO or (type(value) is int and value > 0)


def available_cores() -> int:
    """CPU cores this process may use: its affinity mask, capped by its cgroup's CPU quota."""
    return CpuLoad(len(affinity_cpus()), cgroup_quota(), 0.0).usable


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


def resolve_threads(setting: int | str, free: int, jobs: int) -> int:
    """``auto``: this job's share of the ``free`` cores, at least 1; an int is taken as given."""
    assert is_threads_setting(setting), setting
    return max(1, free // jobs) if setting == AUTO else int(setting)


def free_cores(load: CpuLoad, others: Sequence[Job], cpus: frozenset[int], jobs: int) -> int:
    """Cores of ``load`` free to this job and the ``jobs - 1`` siblings started with it.

    Other work takes the cores that other processes keep busy, or the threads that the other
    posbench jobs registered (``others``) run on these ``cpus``, whichever is more: a running
    job is in both counts, so they are not added, and the registry also counts a job between
    its steps. The siblings are in the busy count too, at up to their share each: that part is
    theirs, not other work's.
    """
    share = max(1, load.usable // jobs)
    measured = load.busy_cores - (jobs - 1) * share
    registered = sum(job.threads_on(cpus) for job in others)
    return load.free_cores(max(measured, registered, 0))


@dataclass
class Machine:
    """Where the load is read: this machine's /proc, cgroups and job registry, or a fake
    machine's (tests/fake_machine.py)."""

    root: Path = ROOT
    registry: JobRegistry = field(default_factory=JobRegistry)
    cpus: frozenset[int] = field(default_factory=affinity_cpus)
    sleep: Callable[[float], None] = time.sleep

    def other_jobs(self, group: int) -> list[Job]:
        """The registered posbench jobs outside this process's ``group`` (its own siblings)."""
        return [j for j in self.registry.jobs() if j.pid != os.getpid() and j.group != group]


def job_group(jobs: int) -> int:
    """The registry group of this job: its parent's pid when posbench started it among
    siblings (joblib's workers and torchrun's ranks share a parent), else its own pid (jobs
    started by hand from one shell share a parent too, but do not count each other)."""
    return os.getppid() if jobs > 1 else os.getpid()


def use_threads(
    setting: int | str, environ: Mapping[str, str] = os.environ, machine: Machine | None = None
) -> Threads:
    """Resolve ``setting`` for this process, apply it with ``torch.set_num_threads`` and log it.

    ``auto`` measures the machine first (``cpu_load.SAMPLE_SECONDS``), and so does a count
    above 1 the user set, for the warning only (warn_if_oversubscribed). Only the intra-op pool
    is set: posbench runs no inter-op parallel work (no torch.jit.fork), and that pool can be
    sized once per process only, which a second run in the same process (tests, notebooks)
    would trip over. Hugging Face ``tokenizers`` (encoding a corpus) sizes its own pool from
    ``RAYON_NUM_THREADS`` when it first encodes in parallel: set here unless the user set it.
    """
    machine = machine or Machine()
    jobs = jobs_at_once(hydra_launcher(), environ)
    if setting == AUTO or setting > 1:  # one thread set is as few as it gets: nothing to tell
        load = measure_load(machine.root, machine.cpus, machine.sleep)
        free = free_cores(load, machine.other_jobs(job_group(jobs)), machine.cpus, jobs)
    else:
        load = CpuLoad(len(machine.cpus), cgroup_quota(machine.root), 0.0)
        free = load.usable
    threads = Threads(resolve_threads(setting, free, jobs), load.usable, jobs, setting, free)
    torch.set_num_threads(threads.threads)
    os.environ.setdefault("RAYON_NUM_THREADS", str(threads.threads))
    log.info(threads.describe())
    return threads


def warn_if_oversubscribed(threads: Threads) -> None:
    """One warning line when this run's threads need cores that other work holds, saying what
    was decided; a count the user set that ``auto`` would have lowered says so too."""
    if not threads.oversubscribed_by_others:
        return
    per_job = f"{threads.threads} thread(s) x {threads.jobs} job(s)"
    if threads.setting == AUTO:
        decided = f"threads=auto runs {per_job} (the fewest it can)"
        advice = "; it takes more threads when cores free up"
    else:
        decided = f"threads={threads.setting} (set) runs {per_job}"
        auto = resolve_threads(AUTO, threads.free, threads.jobs)
        advice = f"; threads=auto would take {auto}" if auto < threads.threads else ""
    log.warning(
        "the machine is busy: other work keeps %d of %d cores busy; %s on %d free core(s), so "
        "steps will be slower%s",
        threads.cores - threads.free,
        threads.cores,
        decided,
        threads.free,
        advice,
    )


@dataclass(frozen=True)
class ThreadChange:
    """A change of thread count while training (results.json's ``train.thread_changes``)."""

    step: int  # the steps done when the count changed
    threads: int
    why: str


class ThreadController:
    """Adapts an ``auto`` run's thread count to the machine while it trains.

    ``after_step`` takes each step's seconds (no reading of /proc there). Once a window holds
    ``CHECK_MIN_STEPS`` steps and ``CHECK_SECONDS`` of time, it asks ``available()`` how many
    threads the machine has free for this job now, and compares the window's median step with
    the last window at the same count that was not oversubscribed:

    - oversubscribed (more threads than available) and ``SLOWDOWN`` times slower: drop to the
      available count at once; with no such window to compare with (oversubscribed since the
      count was taken), after ``AGREEING_CHECKS`` oversubscribed checks in a row;
    - more threads available than it runs, and fewer than its share: raise to them after
      ``AGREEING_CHECKS`` such checks in a row; each rise that the next change undoes doubles
      that wait (up to ``MAX_RISE_CHECKS``), so a load that comes and goes makes a few changes,
      not one every few seconds.

    ``apply`` sets a new count (torch.set_num_threads, the registry entry).
    """

    def __init__(
        self, threads: int, available: Callable[[], int], apply: Callable[[int], None]
    ) -> None:
        self.threads = threads
        self.available = available
        self.apply = apply
        self.changes: list[ThreadChange] = []
        self.window: list[float] = []  # the step times since the last check
        self.window_seconds = 0.0  # their sum, kept as they come: a step adds, never sums
        self.quiet_step: dict[int, float] = {}  # threads -> median step when not oversubscribed
        self.oversubscribed_checks = 0
        self.roomy_checks = 0
        self.rise_checks = AGREEING_CHECKS  # roomy checks in a row before a rise
        self.last_change_rose = False

    def after_step(self, step: int, seconds: float) -> None:
        """Record the step that made ``step`` steps done, and check when a window is full."""
        self.window.append(seconds)
        self.window_seconds += seconds
        if len(self.window) >= CHECK_MIN_STEPS and self.window_seconds >= CHECK_SECONDS:
            median, self.window, self.window_seconds = statistics.median(self.window), [], 0.0
            self.check(step, median)

    def check(self, step: int, median: float) -> None:
        available = self.available()
        if available < self.threads:
            self.roomy_checks = 0
            self.oversubscribed_checks += 1
            quiet = self.quiet_step.get(self.threads)
            if quiet is not None and median > SLOWDOWN * quiet:
                self.change(step, available, f"steps {median / quiet:.1f}x slower")
            elif quiet is None and self.oversubscribed_checks >= AGREEING_CHECKS:
                self.change(step, available, f"oversubscribed for {AGREEING_CHECKS} checks")
            return
        self.oversubscribed_checks = 0
        self.quiet_step[self.threads] = median
        self.roomy_checks = self.roomy_checks + 1 if available > self.threads else 0
        if self.roomy_checks >= self.rise_checks:
            self.change(step, available, f"cores free for {self.roomy_checks} checks")

    def change(self, step: int, threads: int, reason: str) -> None:
        why = f"{reason}, {threads} thread(s) free"
        log.info("threads %d -> %d at step %d: %s", self.threads, threads, step, why)
        rising = threads > self.threads
        if not rising and self.last_change_rose:  # the last rise was too soon: wait longer
            self.rise_checks = min(2 * self.rise_checks, MAX_RISE_CHECKS)
        self.last_change_rose = rising
        self.apply(threads)
        self.changes.append(ThreadChange(step, threads, why))
        self.threads = threads
        self.oversubscribed_checks = self.roomy_checks = 0


def thread_controller(
    threads: Threads, apply: Callable[[int], None], machine: Machine | None = None
) -> ThreadController | None:
    """The controller of an ``auto`` run, measuring ``machine`` from now on; None for a count
    the user set, which is never changed."""
    if threads.setting != AUTO:
        return None
    machine = machine or Machine()
    meter = CpuMeter(machine.root, machine.cpus)
    group = job_group(threads.jobs)

    def available() -> int:
        free = free_cores(meter.read(), machine.other_jobs(group), machine.cpus, threads.jobs)
        return resolve_threads(AUTO, free, threads.jobs)  # at most the job's share

    return ThreadController(threads.threads, available, apply)


@contextmanager
def registered_threads(
    threads: Threads, machine: Machine | None = None
) -> Iterator[ThreadController | None]:
    """This run in the job registry while the block runs, so that other posbench jobs count
    its threads, and the controller of an ``auto`` run (None for a count the user set), which
    keeps the entry current when it changes the count."""
    machine = machine or Machine()
    job = this_job(threads.threads, job_group(threads.jobs), machine.cpus, machine.root / "proc")
    with registered(machine.registry, job) as registration:

        def apply(count: int) -> None:
            torch.set_num_threads(count)
            if registration is not None:
                registration.update(count)

        yield thread_controller(threads, apply, machine)
