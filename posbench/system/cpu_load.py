"""What the machine has free for this job's threads, read from /proc and the cgroup files.

Three numbers make a ``CpuLoad``: the cores this process may run on (its affinity mask), the
CPU quota of its cgroup (``cpu.max`` in cgroup v2, ``cpu.cfs_quota_us / cpu.cfs_period_us``
in v1) and the cores other processes keep busy. Every path is read under a root directory
(``/`` on a real machine, a fake tree in tests), and a file that is missing or unreadable
reads as "no information": no quota, nothing busy, which is what posbench assumed before it
measured (never a traceback).

The busy cores are measured from CPU time, not counted from runnable tasks or the load average:

- **busy time** (``/proc/stat``'s per-CPU lines, for the CPUs of the affinity mask only, minus
  this process's own ``utime + stime`` from ``/proc/self/stat``), as a mean over an interval:
  a short sample at start (``SAMPLE_SECONDS``), the time between two checks while training.
  It is scoped to the cores this job can use (a container's cpuset, ``taskset``), counts what
  a hypervisor steals, and averages over the interval, so a burst is weighed by how long it
  lasts. Its limit: busy time cannot exceed the cores, so it shows how many cores others hold,
  not how many more they would take; that is what the decision needs (cores left to this job).
- **runnable tasks** (``procs_running``) are a count of one instant over the whole machine: in a
  container they count the host's tasks on cores this job cannot use, one instant is noise,
  and this process's own threads (OpenMP workers that sleep and wake many times a step) change
  state between reading the count and reading their states.
- **the 1-minute load average** lags by a minute (the issue's case: 1.58 on 2 cores while a
  one-thread job had just started), and counts this job's own threads and tasks waiting on I/O.

Other posbench jobs are counted from their registry (job_registry.py), which also sees
a job between its steps (evaluating, checkpointing) when its cores are momentarily idle.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/")
# The start sample: long enough for /proc/stat's 10 ms ticks on two cores to read a busy core
# to about 5 %, short next to a run's start-up (importing torch alone takes seconds).
SAMPLE_SECONDS = 0.2
# Others' use of half a core or more counts as a core kept busy: an OpenMP thread parked half
# of the time on that core stalls every barrier of its step; a daemon's few percent does not.
BUSY_CORE = 0.5


@dataclass(frozen=True)
class CpuLoad:
    """What other processes leave of the cores this process may use."""

    cores: int  # CPUs in this process's affinity mask
    quota: float | None  # the cgroup's CPU limit in cores; None: no limit
    others_busy: float  # cores other processes kept busy (mean over the interval measured)

    @property
    def usable(self) -> int:
        """Cores this process may use: its mask, capped by the quota (whole cores, at least 1)."""
        limit = self.cores if self.quota is None else min(self.cores, math.floor(self.quota))
        return max(1, limit)

    @property
    def busy_cores(self) -> int:
        """Cores counted as kept busy by other processes (``BUSY_CORE`` or more of one each)."""
        return math.floor(self.others_busy + 1 - BUSY_CORE)

    def free_cores(self, taken: int) -> int:
        """Cores left to this process when others take ``taken`` of the mask's cores: a quota
        caps what it may use, whatever the host has idle."""
        return max(0, min(self.usable, self.cores - taken))


@dataclass(frozen=True)
class CpuTimes:
    """Cumulative clock ticks at one instant, over the CPUs of the mask."""

    total: int  # every state (busy and idle) of those CPUs: elapsed time x their count
    busy: int  # not idle and not waiting on I/O, by any process
    own: int  # this process's user + system time, all its threads


def affinity_cpus() -> frozenset[int]:
    """The CPUs this process may run on: its affinity mask (taskset, a cgroup cpuset, SLURM),
    which can be fewer than the machine has."""
    if hasattr(os, "sched_getaffinity"):
        return frozenset(os.sched_getaffinity(0))
    return frozenset(range(os.cpu_count() or 1))  # macOS and Windows have no affinity masks


def cpu_times(root: Path, cpus: Collection[int]) -> CpuTimes | None:
    """The mask's CPU ticks now (``/proc/stat``, ``/proc/self/stat``); None where unreadable."""
    try:
        stat = (root / "proc/stat").read_text()
        own = (root / "proc/self/stat").read_text()
        total = busy = 0
        for line in stat.splitlines():
            name, *fields = line.split()
            if not (name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus):
                continue
            # user nice system idle iowait irq softirq steal (guest time is inside user's)
            ticks = [int(f) for f in fields[:8]]
            total += sum(ticks)
            busy += sum(ticks) - ticks[3] - ticks[4]
        # utime and stime are fields 14 and 15; the name before them, in (), may hold spaces
        after_name = own[own.rindex(")") + 2 :].split()
        own_ticks = int(after_name[11]) + int(after_name[12])
    except (OSError, ValueError, IndexError):
        return None
    return CpuTimes(total, busy, own_ticks) if total > 0 else None


def others_busy(before: CpuTimes | None, after: CpuTimes | None, cpus: int) -> float:
    """Cores other processes kept busy between two readings (0 where either is missing)."""
    if before is None or after is None or after.total <= before.total:
        return 0.0
    others = (after.busy - before.busy) - (after.own - before.own)
    return max(0.0, cpus * others / (after.total - before.total))


def cgroup_quota(root: Path = ROOT) -> float | None:
    """The CPU limit, in cores, of this process's cgroup and its ancestors (the tightest);
    None without one. cgroup v2: ``cpu.max`` (``max 100000`` or ``200000 100000``); v1:
    ``cpu.cfs_quota_us`` (-1: none) over ``cpu.cfs_period_us``."""
    quotas = [q for d in _cgroup_directories(root) if (q := _directory_quota(d)) is not None]
    return min(quotas, default=None)


def _cgroup_directories(root: Path) -> list[Path]:
    """The cgroup directories that may limit this process's CPU, its own first, then its
    ancestors up to the mount point (in a container the path may be the host's, not mounted:
    the mount point is always tried)."""
    mount = root / "sys/fs/cgroup"
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return [mount, mount / "cpu"]
    directories = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2's unified hierarchy
            base = mount
        elif "cpu" in controllers.split(","):
            base = mount / controllers
        else:
            continue
        relative = Path(path.lstrip("/"))
        directories += [base / relative, *(base / p for p in relative.parents)]
    return directories


def _directory_quota(directory: Path) -> float | None:
    try:
        if (directory / "cpu.max").is_file():
            quota, period = (directory / "cpu.max").read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        if (directory / "cpu.cfs_quota_us").is_file():
            quota = int((directory / "cpu.cfs_quota_us").read_text())
            period = int((directory / "cpu.cfs_period_us").read_text())
            return None if quota < 0 else quota / period
    except (OSError, ValueError, ZeroDivisionError):
        return None
    return None


class CpuMeter:
    """Reads the load of the interval since its previous reading (or since it was made)."""

    def __init__(self, root: Path = ROOT, cpus: Collection[int] | None = None) -> None:
        self.root = root
        self.cpus = frozenset(affinity_cpus() if cpus is None else cpus)
        self.quota = cgroup_quota(root)
        self.last = cpu_times(root, self.cpus)

    def read(self) -> CpuLoad:
        now = cpu_times(self.root, self.cpus)
        busy = others_busy(self.last, now, len(self.cpus))
        self.last = now if now is not None else self.last
        return CpuLoad(len(self.cpus), self.quota, busy)


def measure_load(
    root: Path = ROOT,
    cpus: Collection[int] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> CpuLoad:
    """The load over a sample of ``SAMPLE_SECONDS``, this process idle meanwhile."""
    meter = CpuMeter(root, cpus)
    sleep(SAMPLE_SECONDS)
    return meter.read()
