"""threads=auto gives each job its share of the cores; the count is applied, logged and recorded."""

import importlib
import json
import logging
import os

import joblib
import pytest
import torch

import posbench.threads
from posbench.config import compose_config, validate
from posbench.errors import PosbenchError
from posbench.resume import check_resumable
from posbench.threads import (
    AUTO,
    JOBLIB_LAUNCHER,
    Threads,
    jobs_at_once,
    machine_busy,
    resolve_threads,
    use_threads,
    warn_if_busy,
)
from posbench.train import train

train_module = importlib.import_module("posbench.train")  # posbench.train is also the function
JOBLIB = {"_target_": JOBLIB_LAUNCHER, "n_jobs": 2}
BASIC = {"_target_": "hydra._internal.core_plugins.basic_launcher.BasicLauncher"}


@pytest.fixture(autouse=True)
def torch_threads():
    """use_threads sets a process-wide count: give the next test the one it had."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture
def four_cores(monkeypatch):
    monkeypatch.setattr(posbench.threads.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})


def test_auto_uses_every_core_this_process_may_use_when_it_runs_alone(four_cores):
    threads = use_threads(AUTO, environ={})
    assert (threads.threads, threads.cores, threads.jobs) == (4, 4, 1)
    assert torch.get_num_threads() == 4


def test_auto_divides_the_cores_among_the_jobs_run_at_once_and_never_goes_below_one():
    assert resolve_threads(AUTO, cores=8, jobs=3) == 2
    assert resolve_threads(AUTO, cores=2, jobs=4) == 1


def test_an_explicit_count_is_taken_as_given():
    assert resolve_threads(3, cores=2, jobs=2) == 3


def test_the_joblib_launcher_runs_n_jobs_at_once_and_other_launchers_one():
    assert jobs_at_once(JOBLIB, environ={}) == 2
    assert jobs_at_once(BASIC, environ={}) == 1
    assert jobs_at_once(None, environ={}) == 1


def test_negative_joblib_n_jobs_count_back_from_joblibs_cpus_as_joblib_does(monkeypatch):
    monkeypatch.setattr(joblib, "cpu_count", lambda: 8)
    assert [jobs_at_once({**JOBLIB, "n_jobs": n}, environ={}) for n in (-1, -2, -20)] == [8, 7, 1]


def test_torchrun_runs_local_world_size_jobs_at_once():
    assert jobs_at_once(None, environ={"LOCAL_WORLD_SIZE": "4"}) == 4
    assert jobs_at_once(JOBLIB, environ={"LOCAL_WORLD_SIZE": "4"}) == 4


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", "true"])
def test_threads_must_be_auto_or_a_positive_integer(value):
    with pytest.raises(PosbenchError, match="threads must be auto or a positive integer") as err:
        validate(compose_config([f"threads={value}"]))
    assert "\n" not in str(err.value)


def test_the_default_is_auto():
    assert compose_config().threads == AUTO


def test_a_resumed_run_may_change_its_thread_count(tmp_path):
    check_resumable(compose_config(["threads=1"]), compose_config(["threads=2"]), tmp_path)


@pytest.mark.parametrize(
    ("load", "cores", "threads", "jobs", "busy"),
    [
        (0.1, 2, 2, 1, False),  # an idle machine
        (2.0, 2, 2, 1, False),  # the previous job of a serial sweep, still in the average
        (3.5, 2, 2, 1, True),  # another job of 2 threads is running
        (2.0, 2, 1, 2, False),  # this joblib sweep's own two workers
        (3.0, 2, 1, 2, True),  # and something else besides
        (9.0, 2, 1, 10, False),  # 10 workers on 2 cores: over-subscribed, but by the sweep
    ],
)
def test_the_machine_is_busy_when_the_load_exceeds_the_cores_and_this_runs_own_jobs(
    load, cores, threads, jobs, busy
):
    assert machine_busy(load, Threads(threads, cores, jobs, AUTO)) is busy


def test_a_busy_machine_gets_one_warning_line_naming_the_threads_key(four_cores, caplog):
    with caplog.at_level(logging.INFO, logger="posbench.threads"):
        warn_if_busy(use_threads(AUTO, environ={}), load_average=lambda: 6.0)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert "load average 6.0 on 4 cores" in warnings[0] and "threads=1" in warnings[0]


def test_a_quiet_machine_or_one_without_a_load_average_gets_no_warning(four_cores, caplog):
    for load in (lambda: 1.0, lambda: None):
        warn_if_busy(use_threads(AUTO, environ={}), load_average=load)
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_training_runs_with_the_threads_it_logs_first_and_records(
    tiny, tmp_path, monkeypatch, caplog
):
    observed = []
    train_steps = train_module.train_steps

    def observing(*args, **kwargs):
        observed.append(torch.get_num_threads())
        return train_steps(*args, **kwargs)

    monkeypatch.setattr(train_module, "train_steps", observing)
    with caplog.at_level(logging.INFO):
        results = train(compose_config([*tiny, "threads=3", "eval.lengths=[16]"]), tmp_path)
    assert observed == [3]
    assert results["threads"] == 3
    assert json.loads((tmp_path / "results.json").read_text())["threads"] == 3
    assert caplog.records[0].getMessage() == "threads 3 (set; " + (
        f"{posbench.threads.available_cores()} cores)"
    )


def test_the_log_line_says_where_an_automatic_count_came_from():
    assert Threads(1, 2, 2, AUTO).describe() == "threads 1 (auto: 2 cores / 2 jobs at once)"
    assert Threads(4, 4, 1, AUTO).describe() == "threads 4 (auto: 4 cores / 1 job at once)"


def test_the_tokenizers_pool_gets_the_runs_threads_unless_the_user_sized_it(monkeypatch):
    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    use_threads(1, environ={})
    assert os.environ["RAYON_NUM_THREADS"] == "1"
    monkeypatch.setenv("RAYON_NUM_THREADS", "7")
    use_threads(1, environ={})
    assert os.environ["RAYON_NUM_THREADS"] == "7"
