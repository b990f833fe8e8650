"""The posbench jobs running on this machine, so that jobs started by hand count each other.

One JSON file per job, ``<pid>.json`` in ``jobs/<namespace>/`` under the cache root
(cache_root.py: ``$POSBENCH_CACHE``, else ``~/.cache/posbench``, one per user; a run's
``data.cache_dir`` moves its corpora, not its entry), written
atomically when a training run sets its threads and again when it changes them, removed when
it ends. A job killed outright (SIGKILL, a power cut) leaves its file behind: readers drop an
entry whose process is gone, or whose pid now belongs to another process (the start time in
``/proc/<pid>/stat`` differs from the one recorded). The registry is advice, never a reason
to fail: a registry that cannot be written or read lists no jobs.

A pid means something only on its machine and in its pid namespace, and a cache root may be
shared beyond them (a home directory on NFS across a cluster's nodes, containers mounting one
cache). So each namespace (``pid_namespace``: the boot id and the pid namespace's inode) has
its own directory, and a job reads and cleans only its own: the jobs of another node are not
on its cores, and those of another container on the same machine are in the busy cores it
measures (cpu_load.py), not in its registry.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from posbench.system.atomic import write_json
from posbench.system.cache_root import cache_root

log = logging.getLogger(__name__)

PROC = Path("/proc")


@dataclass(frozen=True)
class Job:
    """A running posbench job, as its registry file records it."""

    pid: int
    threads: int
    start_ticks: int  # the process's start time (/proc/<pid>/stat field 22): tells a reused pid
    started: float  # when it registered (Unix time), for a person reading the file
    group: int  # jobs of one group were started together by posbench and count themselves
    cpus: tuple[int, ...]  # the CPUs it may run on

    def threads_on(self, cpus: Collection[int]) -> int:
        """The threads of this job that compete for ``cpus``: none if its mask misses them."""
        return min(self.threads, len(set(self.cpus) & set(cpus)))


def default_directory() -> Path:
    return cache_root(None) / "jobs"


def pid_namespace(proc: Path = PROC) -> str:
    """Which machine and pid namespace this process's pids belong to, as ``<boot id>-<pid
    namespace inode>``; ``local`` where ``proc`` tells neither (no /proc)."""
    try:
        boot = (proc / "sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    try:
        link = os.readlink(proc / "self/ns/pid")  # "pid:[4026531836]"
        inode = link[link.index("[") + 1 : link.index("]")]
    except (OSError, ValueError):
        inode = ""
    return f"{boot}-{inode}" if boot or inode else "local"


def process_start_ticks(pid: int, proc: Path = PROC) -> int | None:
    """When process ``pid`` started, in clock ticks after boot; None if there is none."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
        return int(stat[stat.rindex(")") + 2 :].split()[19])  # field 22; the name may hold spaces
    except (OSError, ValueError, IndexError):
        return None


class JobRegistry:
    """The registry in ``directory`` (default: ``jobs/`` under the cache root), of the jobs in
    the pid namespace that ``proc`` shows, telling live processes from dead ones through it."""

    def __init__(self, directory: Path | None = None, proc: Path = PROC) -> None:
        root = default_directory() if directory is None else directory
        self.directory = root / pid_namespace(proc)
        self.proc = proc

    def path(self, pid: int) -> Path:
        return self.directory / f"{pid}.json"

    def write(self, job: Job) -> bool:
        """Record ``job`` (replacing its previous entry); False where the registry is not
        writable."""
        try:
            write_json(self.path(job.pid), asdict(job))
        except OSError as err:
            log.debug("job registry %s not written: %s", self.directory, err)
            return False
        return True

    def remove(self, pid: int) -> None:
        try:
            self.path(pid).unlink(missing_ok=True)
        except OSError as err:
            log.debug("job registry entry %s not removed: %s", self.path(pid), err)

    def jobs(self) -> list[Job]:
        """The live jobs registered, removing the entries of dead processes; none where the
        registry cannot be read. A file that does not parse is skipped, not removed: it may be
        a newer posbench's."""
        try:
            paths = sorted(self.directory.glob("*.json"))
        except OSError:
            return []
        live = []
        for path in paths:
            job = _read_job(path)
            if job is None:
                continue
            if process_start_ticks(job.pid, self.proc) == job.start_ticks:
                live.append(job)
            else:
                self.remove(job.pid)
        return live


def _read_job(path: Path) -> Job | None:
    try:
        fields = json.loads(path.read_text())
        return Job(**{**fields, "cpus": tuple(fields["cpus"])})
    except (OSError, ValueError, TypeError, KeyError):
        return None


class Registration:
    """This process's entry in a registry, kept current while it runs."""

    def __init__(self, registry: JobRegistry, job: Job) -> None:
        self.registry, self.job = registry, job

    def update(self, threads: int) -> None:
        self.job = replace(self.job, threads=threads)
        self.registry.write(self.job)


def this_job(threads: int, group: int, cpus: Collection[int], proc: Path = PROC) -> Job | None:
    """This process as a registry entry; None where its start time cannot be read (no /proc):
    an entry that cannot be told from a reused pid is not written."""
    start = process_start_ticks(os.getpid(), proc)
    if start is None:
        return None
    return Job(os.getpid(), threads, start, time.time(), group, tuple(sorted(cpus)))


@contextmanager
def registered(registry: JobRegistry, job: Job | None) -> Iterator[Registration | None]:
    """``job`` in ``registry`` while the block runs; None (nothing written) without a job."""
    if job is None or not registry.write(job):
        yield None
        return
    try:
        yield Registration(registry, job)
    finally:
        registry.remove(job.pid)
