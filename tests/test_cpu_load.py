"""What the machine has free: the mask, the cgroup quota and the cores other processes keep busy,
read from a fake /proc and cgroup tree."""

import pytest
from fake_machine import FakeMachine, process_stat

from posbench.system.cpu_load import (
    SAMPLE_SECONDS,
    CpuLoad,
    CpuMeter,
    cgroup_quota,
    cpu_times,
    measure_load,
)


@pytest.fixture
def fake(tmp_path):
    return FakeMachine(tmp_path / "machine", cores=4)


def test_a_quiet_machine_has_nothing_busy_and_every_core_of_the_mask_free(fake):
    load = measure_load(fake.root, fake.mask, fake.advance)
    assert load == CpuLoad(cores=4, quota=None, others_busy=0.0)
    assert load.free_cores(load.busy_cores) == 4


def test_the_busy_cores_are_the_busy_time_of_other_processes(fake):
    fake.others = 1.0
    load = measure_load(fake.root, fake.mask, fake.advance)
    assert load.others_busy == pytest.approx(1.0)
    assert load.free_cores(load.busy_cores) == 3


def test_this_process_own_cpu_time_is_not_counted_as_busy(fake):
    fake.own, fake.others = 2.0, 1.0
    assert measure_load(fake.root, fake.mask, fake.advance).others_busy == pytest.approx(1.0)


def test_only_the_cpus_of_the_affinity_mask_are_measured(tmp_path):
    fake = FakeMachine(tmp_path, cores=4, mask=frozenset({0, 1}))
    fake.busy_cpus, fake.others = frozenset({2, 3}), 2.0  # another container's cores
    load = measure_load(fake.root, fake.mask, fake.advance)
    assert (load.cores, load.others_busy) == (2, 0.0)


@pytest.mark.parametrize(("busy", "cores"), [(0.2, 0), (0.49, 0), (0.5, 1), (1.4, 1), (1.6, 2)])
def test_a_core_counts_as_busy_when_others_use_half_of_it_or_more(busy, cores):
    assert CpuLoad(4, None, busy).busy_cores == cores


def test_the_meter_reads_the_interval_since_its_previous_reading(fake):
    meter = CpuMeter(fake.root, fake.mask)
    fake.others = 2.0
    fake.advance(1.0)
    assert meter.read().others_busy == pytest.approx(2.0)
    fake.others = 0.0
    fake.advance(1.0)
    assert meter.read().others_busy == 0.0


def test_the_start_sample_sleeps_the_sample_time(fake):
    slept = []
    measure_load(fake.root, fake.mask, slept.append)
    assert slept == [SAMPLE_SECONDS]


@pytest.mark.parametrize(
    ("line", "files", "quota"),
    [
        ("0::/user.slice/job", {"user.slice/job/cpu.max": "150000 100000"}, 1.5),
        ("0::/user.slice/job", {"user.slice/cpu.max": "200000 100000"}, 2.0),  # an ancestor's
        ("0::/", {"cpu.max": "max 100000"}, None),
        ("1:cpu,cpuacct:/docker/abc", {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "300000",
                                       "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000"}, 3.0),
        ("1:cpu:/", {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, None),
    ],
)  # fmt: skip
def test_the_cgroup_quota_is_read_from_cgroup_v2_and_v1(fake, line, files, quota):
    fake.set_cgroup(line, files)
    assert cgroup_quota(fake.root) == quota


def test_the_tightest_quota_of_a_cgroup_and_its_ancestors_wins(fake):
    fake.set_cgroup("0::/a/b", {"a/cpu.max": "100000 100000", "a/b/cpu.max": "300000 100000"})
    assert cgroup_quota(fake.root) == 1.0


def test_a_quota_caps_the_cores_a_job_may_use_whatever_the_host_has_idle():
    load = CpuLoad(cores=64, quota=2.5, others_busy=30.0)
    assert load.usable == 2
    assert load.free_cores(load.busy_cores) == 2


def test_a_quota_under_one_core_still_leaves_one_core_to_use():
    assert CpuLoad(cores=4, quota=0.5, others_busy=0.0).usable == 1


def test_missing_files_read_as_no_quota_and_nothing_busy(tmp_path):
    assert cgroup_quota(tmp_path) is None
    assert cpu_times(tmp_path, {0, 1}) is None
    assert measure_load(tmp_path, {0, 1}, lambda s: None) == CpuLoad(2, None, 0.0)


@pytest.mark.parametrize("content", ["", "cpu0 1 2\n", "garbage"])
def test_unreadable_counters_read_as_nothing_busy(fake, content):
    (fake.root / "proc/stat").write_text(content)
    assert measure_load(fake.root, fake.mask, fake.advance).others_busy == 0.0


def test_unparsable_cgroup_files_read_as_no_quota(fake):
    fake.set_cgroup("0::/", {"cpu.max": "lots"})
    assert cgroup_quota(fake.root) is None


def test_a_process_name_with_spaces_and_parentheses_is_read_past(fake):
    (fake.root / "proc/self/stat").write_text(process_stat(1, 1, own_ticks=42, name="a (b) c"))
    assert cpu_times(fake.root, fake.mask).own == 42
