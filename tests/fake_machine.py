"""A fake machine for the thread decision: /proc, cgroup files and a posbench job registry under
a temporary directory, whose CPU counters advance when told (``advance`` is its clock)."""

from __future__ import annotations

import os
from pathlib import Path

from posbench.system.job_registry import Job, JobRegistry
from posbench.system.threads import Machine

TICKS_PER_SECOND = 100  # USER_HZ, as /proc/stat counts
THIS_START = 5000  # this process's start time in ticks after boot


def process_stat(pid: int, start_ticks: int, own_ticks: int = 0, name: str = "python") -> str:
    """A /proc/<pid>/stat line: utime (field 14) holds ``own_ticks``, starttime (22) the start."""
    fields = ["R", "1", str(pid), str(pid), "0", "-1", "0", "0", "0", "0", "0"]
    fields += [str(own_ticks), "0", "0", "0", "20", "0", "1", "0", str(start_ticks), "0"]
    return f"{pid} ({name}) {' '.join(fields)}\n"


class FakeMachine:
    """``cores`` CPUs, all in this process's mask unless ``mask`` says which; ``others`` and
    ``own`` are the cores other processes and this one keep busy while time advances."""

    def __init__(self, root: Path, cores: int = 2, mask: frozenset[int] | None = None) -> None:
        self.root, self.cores = root, cores
        self.mask = frozenset(range(cores)) if mask is None else mask
        self.busy_cpus: frozenset[int] = self.mask  # where the others' work runs
        self.others, self.own = 0.0, 0.0
        # user nice system idle iowait irq softirq steal, since a boot 10 s ago
        self.cpu_ticks = [[0, 0, 0, 1000, 0, 0, 0, 0] for _ in range(cores)]
        self.own_ticks = 0
        (root / "proc").mkdir(parents=True)
        self.registry_directory = root / "cache" / "jobs"
        self.start_process(os.getpid(), THIS_START)
        self.write_counters()

    def machine(self) -> Machine:
        registry = JobRegistry(self.registry_directory, self.root / "proc")
        return Machine(self.root, registry, self.mask, sleep=self.advance)

    def advance(self, seconds: float) -> None:
        """``seconds`` pass: the others' busy cores spread over ``busy_cpus``, this process's
        over the mask, the rest idle."""
        ticks = round(seconds * TICKS_PER_SECOND)
        for cpu in range(self.cores):
            busy = 0.0
            if cpu in self.busy_cpus:
                busy += self.others / len(self.busy_cpus)
            if cpu in self.mask:
                busy += self.own / len(self.mask)
            busy_ticks = round(min(1.0, busy) * ticks)
            self.cpu_ticks[cpu][0] += busy_ticks
            self.cpu_ticks[cpu][3] += ticks - busy_ticks
        self.own_ticks += round(self.own * ticks)
        self.write_counters()

    def write_counters(self) -> None:
        lines = ["cpu " + " ".join(str(sum(c)) for c in zip(*self.cpu_ticks, strict=True))]
        lines += [f"cpu{i} " + " ".join(map(str, t)) + " 0 0" for i, t in enumerate(self.cpu_ticks)]
        lines += ["procs_running 1", "procs_blocked 0"]
        (self.root / "proc/stat").write_text("\n".join(lines) + "\n")
        (self.root / "proc/self").mkdir(exist_ok=True)
        stat = process_stat(os.getpid(), THIS_START, self.own_ticks)
        (self.root / "proc/self/stat").write_text(stat)

    def start_process(self, pid: int, start_ticks: int) -> None:
        (self.root / "proc" / str(pid)).mkdir(exist_ok=True)
        (self.root / "proc" / str(pid) / "stat").write_text(process_stat(pid, start_ticks))

    def end_process(self, pid: int) -> None:
        (self.root / "proc" / str(pid) / "stat").unlink()
        (self.root / "proc" / str(pid)).rmdir()

    def run_job(
        self,
        pid: int,
        threads: int,
        start_ticks: int = 7000,
        group: int | None = None,
        cpus: tuple[int, ...] | None = None,
    ) -> Job:
        """Another posbench job, running and registered (by default in a group of its own, on
        this process's mask)."""
        self.start_process(pid, start_ticks)
        group = pid if group is None else group
        job = Job(pid, threads, start_ticks, 0.0, group, tuple(self.mask) if cpus is None else cpus)
        JobRegistry(self.registry_directory, self.root / "proc").write(job)
        return job

    def set_cgroup(self, line: str, files: dict[str, str]) -> None:
        """This process's /proc/self/cgroup ``line``, and ``files`` under /sys/fs/cgroup."""
        (self.root / "proc/self/cgroup").write_text(line + "\n")
        for relative, content in files.items():
            path = self.root / "sys/fs/cgroup" / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content + "\n")
