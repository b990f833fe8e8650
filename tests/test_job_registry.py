"""The registry of running posbench jobs: one entry per job while it runs, dead entries dropped
when read, and never a reason for a run to fail."""

import os
from pathlib import Path

import pytest
from fake_machine import THIS_START, FakeMachine

from posbench.system.job_registry import (
    Job,
    JobRegistry,
    pid_namespace,
    process_start_ticks,
    registered,
    this_job,
)


@pytest.fixture
def fake(tmp_path):
    return FakeMachine(tmp_path / "machine", cores=2)


@pytest.fixture
def registry(fake):
    return JobRegistry(fake.registry_directory, fake.root / "proc")


def test_a_job_is_listed_while_its_block_runs_and_removed_after(fake, registry):
    job = this_job(2, group=os.getpid(), cpus={0, 1}, proc=fake.root / "proc")
    with registered(registry, job):
        assert registry.jobs() == [job]
    assert registry.jobs() == []
    assert not registry.path(job.pid).exists()


def test_the_entry_is_removed_when_the_block_raises(fake, registry):
    job = this_job(1, group=os.getpid(), cpus={0}, proc=fake.root / "proc")
    with pytest.raises(RuntimeError), registered(registry, job):
        raise RuntimeError
    assert registry.jobs() == []


def test_an_entry_records_this_process_and_its_start_time(fake):
    job = this_job(3, group=11, cpus={1, 0}, proc=fake.root / "proc")
    assert (job.pid, job.threads, job.start_ticks, job.group, job.cpus) == (
        os.getpid(),
        3,
        THIS_START,
        11,
        (0, 1),
    )


def test_an_update_rewrites_the_entry_with_the_new_thread_count(fake, registry):
    job = this_job(2, group=os.getpid(), cpus={0, 1}, proc=fake.root / "proc")
    with registered(registry, job) as registration:
        registration.update(1)
        assert [j.threads for j in registry.jobs()] == [1]


def test_the_entry_of_a_process_that_is_gone_is_dropped_and_removed(fake, registry):
    fake.run_job(4242, threads=2)
    assert [j.pid for j in registry.jobs()] == [4242]
    fake.end_process(4242)
    assert registry.jobs() == []
    assert not registry.path(4242).exists()


def test_the_entry_of_a_pid_reused_by_another_process_is_dropped(fake, registry):
    fake.run_job(4242, threads=2, start_ticks=7000)
    fake.start_process(4242, start_ticks=9000)  # the job died; a new process got its pid
    assert registry.jobs() == []
    assert not registry.path(4242).exists()


def test_a_file_that_does_not_parse_is_skipped_and_kept(fake, registry):
    fake.run_job(4242, threads=2)
    registry.path(4243).write_text("{not json")
    assert [j.pid for j in registry.jobs()] == [4242]
    assert registry.path(4243).exists()


def test_a_missing_or_unreadable_registry_lists_no_jobs(tmp_path):
    assert JobRegistry(tmp_path / "none").jobs() == []
    (tmp_path / "file").write_text("")
    assert JobRegistry(tmp_path / "file").jobs() == []


def test_an_unwritable_registry_registers_nothing_and_the_block_still_runs(fake, tmp_path):
    (tmp_path / "file").write_text("")  # a registry directory that cannot be made
    job = this_job(1, group=os.getpid(), cpus={0}, proc=fake.root / "proc")
    with registered(JobRegistry(tmp_path / "file" / "jobs"), job) as registration:
        assert registration is None


def test_without_a_start_time_to_tell_a_reused_pid_nothing_is_registered(tmp_path):
    assert this_job(1, group=1, cpus={0}, proc=tmp_path) is None
    assert process_start_ticks(os.getpid(), tmp_path) is None


def test_a_job_competes_only_with_the_threads_it_runs_on_shared_cpus():
    job = Job(1, threads=4, start_ticks=0, started=0.0, group=1, cpus=(0, 1, 2, 3))
    assert job.threads_on({0, 1, 2, 3, 4, 5}) == 4
    assert job.threads_on({2, 3}) == 2
    assert job.threads_on({6, 7}) == 0


def test_the_start_time_is_read_from_the_real_proc_where_there_is_one():
    if not os.path.exists("/proc/self/stat"):
        pytest.skip("no /proc")
    assert process_start_ticks(os.getpid()) > 0


def in_namespace(proc, boot_id: str, inode: int) -> None:
    """Give the fake ``proc`` a boot id and a pid namespace."""
    (proc / "sys/kernel/random").mkdir(parents=True, exist_ok=True)
    (proc / "sys/kernel/random/boot_id").write_text(boot_id + "\n")
    (proc / "self").mkdir(exist_ok=True)
    (proc / "self/ns").mkdir(exist_ok=True)
    (proc / "self/ns/pid").unlink(missing_ok=True)
    os.symlink(f"pid:[{inode}]", proc / "self/ns/pid")


def test_jobs_of_another_machine_or_pid_namespace_sharing_the_cache_are_neither_counted_nor_removed(
    fake, tmp_path
):
    proc, directory = fake.root / "proc", fake.registry_directory
    in_namespace(proc, "node-b", 4026531836)
    node_b = JobRegistry(directory, proc)
    fake.start_process(4242, 7000)
    node_b.write(Job(4242, 2, 7000, 0.0, 4242, (0, 1)))
    assert [j.pid for j in node_b.jobs()] == [4242]
    fake.end_process(4242)  # no process 4242 where the others look: not a reason to remove it
    for boot_id, inode in (("node-a", 4026531836), ("node-b", 4026532000)):  # node, container
        in_namespace(proc, boot_id, inode)
        assert JobRegistry(directory, proc).jobs() == []
    assert node_b.path(4242).exists()


def test_the_namespace_of_the_real_proc_is_its_boot_id_and_pid_namespace():
    if not os.path.exists("/proc/self/ns/pid"):
        pytest.skip("no /proc")
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert pid_namespace() == f"{boot_id}-{os.stat('/proc/self/ns/pid').st_ino}"
    assert pid_namespace(Path("/nonexistent")) == "local"
