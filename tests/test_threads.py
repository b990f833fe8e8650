"""threads=auto takes what the machine has free and adapts it while training; a count the user
sets is kept; the count is applied, logged and recorded."""

import itertools
import json
import logging
import os
from contextlib import contextmanager

import joblib
import pytest
import torch
from conftest import train_module
from fake_machine import FakeMachine

import posbench.system.threads
import posbench.training.train_loop
from posbench.config import compose_config, validate
from posbench.data import Corpus
from posbench.errors import PosbenchError
from posbench.system.cpu_load import CpuLoad
from posbench.system.job_registry import Job
from posbench.system.threads import (
    AUTO,
    CHECK_MIN_STEPS,
    CHECK_SECONDS,
    JOBLIB_LAUNCHER,
    MAX_RISE_CHECKS,
    SLOWDOWN,
    ThreadChange,
    ThreadController,
    Threads,
    free_cores,
    jobs_at_once,
    registered_threads,
    resolve_threads,
    thread_controller,
    use_threads,
    warn_if_oversubscribed,
)
from posbench.training.resume import check_resumable
from posbench.training.train import train

JOBLIB = {"_target_": JOBLIB_LAUNCHER, "n_jobs": 2}
BASIC = {"_target_": "hydra._internal.core_plugins.basic_launcher.BasicLauncher"}


@pytest.fixture(autouse=True)
def torch_threads():
    """use_threads sets a process-wide count: give the next test the one it had."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture
def fake(tmp_path):
    """A quiet fake machine of 2 cores."""
    return FakeMachine(tmp_path / "machine", cores=2)


def test_auto_uses_every_core_of_a_quiet_machine_when_it_runs_alone(tmp_path):
    fake = FakeMachine(tmp_path, cores=4)
    threads = use_threads(AUTO, environ={}, machine=fake.machine())
    assert (threads.threads, threads.cores, threads.jobs, threads.free) == (4, 4, 1, 4)
    assert torch.get_num_threads() == 4


def test_auto_leaves_the_cores_other_processes_keep_busy(fake):
    fake.others = 1.0  # a one-thread job that is not posbench
    assert use_threads(AUTO, environ={}, machine=fake.machine()).threads == 1


def test_auto_counts_the_threads_of_other_posbench_jobs_between_their_steps(fake):
    fake.run_job(4242, threads=1)  # registered, and evaluating or checkpointing: nothing busy
    assert use_threads(AUTO, environ={}, machine=fake.machine()).threads == 1


def test_a_registered_job_that_keeps_its_cores_busy_is_counted_once(tmp_path):
    fake = FakeMachine(tmp_path, cores=4)
    fake.run_job(4242, threads=1)
    fake.others = 1.0  # that job's thread, seen in the busy time too
    assert use_threads(AUTO, environ={}, machine=fake.machine()).threads == 3


def test_a_registered_job_on_other_cpus_does_not_count(fake):
    fake.run_job(4242, threads=2, cpus=(7,))
    assert use_threads(AUTO, environ={}, machine=fake.machine()).threads == 2


def test_the_siblings_a_sweep_started_count_by_construction_not_through_the_registry(tmp_path):
    fake = FakeMachine(tmp_path, cores=4)
    fake.run_job(4242, threads=2, group=os.getppid())  # the other joblib worker
    fake.others = 2.0  # its two threads
    threads = use_threads(AUTO, environ={"LOCAL_WORLD_SIZE": "2"}, machine=fake.machine())
    assert (threads.threads, threads.jobs) == (2, 2)


def test_auto_never_goes_below_one_thread(fake):
    fake.others = 2.0
    threads = use_threads(AUTO, environ={}, machine=fake.machine())
    assert (threads.threads, threads.free) == (1, 0)


def test_a_count_the_user_set_is_kept_on_a_busy_machine(fake):
    fake.others = 2.0
    fake.run_job(4242, threads=2)
    assert use_threads(3, environ={}, machine=fake.machine()).threads == 3
    assert torch.get_num_threads() == 3


def test_a_users_count_above_the_free_cores_warns_with_what_auto_would_take(fake, caplog):
    fake.others = 1.0
    threads = use_threads(2, environ={}, machine=fake.machine())
    assert (threads.threads, threads.free) == (2, 1)
    assert warnings_of(caplog, threads)[0].endswith("threads=auto would take 1")


def test_one_thread_set_by_the_user_takes_no_measurement(fake):
    slept = []
    machine = fake.machine()
    machine.sleep = slept.append
    assert use_threads(1, environ={}, machine=machine).threads == 1
    assert slept == []


def test_a_count_the_user_set_gets_no_controller_and_never_changes(fake):
    threads = Threads(2, 2, 1, 2, 2)
    assert thread_controller(threads, apply=pytest.fail, machine=fake.machine()) is None


def test_the_cgroup_quota_caps_auto(tmp_path):
    fake = FakeMachine(tmp_path, cores=4)
    fake.set_cgroup("0::/", {"cpu.max": "200000 100000"})
    threads = use_threads(AUTO, environ={}, machine=fake.machine())
    assert (threads.threads, threads.cores) == (2, 2)


def test_busy_cores_and_registered_threads_are_not_added_but_the_larger_taken():
    load = CpuLoad(cores=4, quota=None, others_busy=1.0)
    two = [Job(9, 2, 0, 0.0, 9, (0, 1, 2, 3))]
    assert free_cores(load, two, frozenset(range(4)), jobs=1) == 2
    assert free_cores(load, [], frozenset(range(4)), jobs=1) == 3


def test_auto_divides_the_free_cores_among_the_jobs_run_at_once_and_never_goes_below_one():
    assert resolve_threads(AUTO, free=8, jobs=3) == 2
    assert resolve_threads(AUTO, free=2, jobs=4) == 1


def test_an_explicit_count_is_taken_as_given():
    assert resolve_threads(3, free=2, jobs=2) == 3


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
    ("threads", "free", "setting", "oversubscribed"),
    [
        (2, 2, AUTO, False),  # a quiet machine
        (1, 1, AUTO, False),  # auto left the busy core
        (1, 0, AUTO, True),  # every core busy: even one thread oversubscribes
        (2, 1, 2, True),  # the user's count on a busy core
        (1, 1, 1, False),  # the user's one thread beside a one-thread job
    ],
)
def test_a_run_is_oversubscribed_by_others_when_its_threads_exceed_the_free_cores(
    threads, free, setting, oversubscribed
):
    assert Threads(threads, 2, 1, setting, free).oversubscribed_by_others is oversubscribed


def test_a_sweep_of_more_workers_than_cores_on_a_quiet_machine_is_its_own_choice():
    assert not Threads(1, 2, 10, AUTO, 2).oversubscribed_by_others


def warnings_of(caplog, threads):
    with caplog.at_level(logging.INFO, logger="posbench.system.threads"):
        warn_if_oversubscribed(threads)
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_auto_on_a_full_machine_warns_once_saying_what_it_decided(caplog):
    [warning] = warnings_of(caplog, Threads(1, 2, 1, AUTO, 0))
    assert "\n" not in warning
    assert "keeps 2 of 2 cores busy" in warning and "threads=auto runs 1 thread(s)" in warning


def test_a_user_who_set_one_thread_is_not_told_to_set_one_thread(caplog):
    [warning] = warnings_of(caplog, Threads(1, 2, 1, 1, 0))
    assert "threads=1 (set) runs 1 thread(s)" in warning
    assert "would take" not in warning


def test_a_user_count_that_auto_would_lower_says_what_auto_would_take(caplog):
    [warning] = warnings_of(caplog, Threads(2, 2, 1, 2, 1))
    assert warning.endswith("threads=auto would take 1")


def test_a_decision_that_avoids_oversubscribing_gets_no_warning(caplog):
    assert warnings_of(caplog, Threads(1, 2, 1, AUTO, 1)) == []
    assert warnings_of(caplog, Threads(2, 2, 1, AUTO, 2)) == []


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
        f"{posbench.system.threads.available_cores()} cores)"
    )


def test_the_log_line_says_where_an_automatic_count_came_from():
    assert Threads(1, 2, 2, AUTO, 2).describe() == "threads 1 (auto: 2 cores / 2 jobs at once)"
    assert Threads(4, 4, 1, AUTO, 4).describe() == "threads 4 (auto: 4 cores / 1 job at once)"
    assert (
        Threads(1, 2, 1, AUTO, 1).describe()
        == "threads 1 (auto: 1 of 2 cores free / 1 job at once)"
    )


def test_the_tokenizers_pool_gets_the_runs_threads_unless_the_user_sized_it(monkeypatch):
    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    use_threads(1, environ={})
    assert os.environ["RAYON_NUM_THREADS"] == "1"
    monkeypatch.setenv("RAYON_NUM_THREADS", "7")
    use_threads(1, environ={})
    assert os.environ["RAYON_NUM_THREADS"] == "7"


class Script:
    """The threads ``available()`` reports at each check, one value per check."""

    def __init__(self, *available: int) -> None:
        self.values, self.calls = list(available), 0

    def __call__(self) -> int:
        self.calls += 1
        return self.values[min(self.calls, len(self.values)) - 1]


STEP = CHECK_SECONDS / CHECK_MIN_STEPS  # a window of CHECK_MIN_STEPS such steps is one check


class Run:
    """A run's controller at ``threads``, fed windows of synthetic step times."""

    def __init__(self, threads: int, available: Script) -> None:
        self.applied: list[int] = []
        self.controller = ThreadController(threads, available, self.applied.append)
        self.step = 0

    def windows(self, *step_seconds: float) -> None:
        """One check's window of steps of each given length."""
        for seconds in step_seconds:
            for _ in range(CHECK_MIN_STEPS):
                self.step += 1
                self.controller.after_step(self.step, seconds)


def test_steps_sharply_slower_on_an_oversubscribed_machine_drop_to_the_free_threads():
    run = Run(2, Script(2, 1))
    run.windows(STEP, STEP * (SLOWDOWN + 0.5))
    assert run.applied == [1]
    assert [(c.step, c.threads) for c in run.controller.changes] == [(2 * CHECK_MIN_STEPS, 1)]
    assert run.controller.changes[0].why.startswith("steps 2.0x slower")


def test_slower_steps_on_a_machine_that_is_not_oversubscribed_keep_the_count():
    run = Run(2, Script(2, 2, 2))
    run.windows(STEP, 3 * STEP, 3 * STEP)
    assert run.applied == [] and run.controller.changes == []


def test_an_oversubscribed_machine_whose_steps_are_no_slower_keeps_the_count():
    run = Run(2, Script(2, 1, 1, 1))
    run.windows(STEP, STEP * 1.1, STEP * 1.1, STEP * 1.1)
    assert run.applied == []


def test_a_run_oversubscribed_since_it_took_its_count_drops_after_two_checks():
    run = Run(2, Script(1, 1))
    run.windows(STEP)
    assert run.applied == []
    run.windows(STEP)
    assert run.applied == [1]
    assert run.controller.changes[0].why.startswith("oversubscribed for 2 checks")


def test_the_count_rises_again_after_two_checks_with_cores_free():
    run = Run(1, Script(2, 1, 2, 2))
    run.windows(STEP, STEP, STEP)
    assert run.applied == []  # a check with a core free, one without, one with again
    run.windows(STEP)
    assert run.applied == [2]
    assert run.controller.changes == [
        ThreadChange(4 * CHECK_MIN_STEPS, 2, "cores free for 2 checks, 2 thread(s) free")
    ]


def test_a_drop_then_a_rise_are_both_recorded_in_order():
    run = Run(2, Script(2, 1, 2, 2))
    run.windows(STEP, 2 * STEP, 2 * STEP, 2 * STEP)
    assert run.applied == [1, 2]
    assert [c.threads for c in run.controller.changes] == [1, 2]


def test_a_rise_that_a_drop_undoes_doubles_the_wait_for_the_next_rise():
    run = Run(1, Script(2, 2, 2, 1, 2, 2, 2, 2, 1, *[2] * 8))
    run.windows(STEP, STEP, STEP, 2 * STEP)  # up after 2 roomy checks, down 2 checks later
    assert run.applied == [2, 1]
    run.windows(STEP, STEP)
    assert run.applied == [2, 1]  # 2 roomy checks no longer raise it
    run.windows(STEP, STEP)
    assert run.applied == [2, 1, 2]
    assert run.controller.changes[-1].why == "cores free for 4 checks, 2 thread(s) free"
    run.windows(2 * STEP, *[STEP] * 8)  # undone again: the next rise waits 8 checks
    assert run.applied == [2, 1, 2, 1, 2]
    assert run.controller.changes[-1].why.startswith("cores free for 8 checks")


def test_the_wait_for_a_rise_stops_doubling_at_its_cap():
    controller = ThreadController(1, Script(2), lambda threads: None)
    for step in range(1, 20, 2):  # ten rises, each undone
        controller.change(step, 2, "cores free")
        controller.change(step + 1, 1, "steps 2.0x slower")
    assert controller.rise_checks == MAX_RISE_CHECKS


def test_the_machine_is_read_once_per_check_not_per_step():
    available = Script(2)
    run = Run(2, available)
    for step in range(1, 1001):
        run.controller.after_step(step, 0.01)  # 10 s of steps
    assert available.calls == int(1000 * 0.01 / CHECK_SECONDS)


def test_each_change_is_one_log_line(caplog):
    run = Run(2, Script(2, 1))
    with caplog.at_level(logging.INFO, logger="posbench.system.threads"):
        run.windows(STEP, 2 * STEP, 2 * STEP)
    changes = [r.getMessage() for r in caplog.records if "->" in r.getMessage()]
    assert changes == ["threads 2 -> 1 at step 10: steps 2.0x slower, 1 thread(s) free"]


def test_a_change_sets_torch_threads_and_the_registry_entry(fake):
    fake.others = 2.0
    machine = fake.machine()
    with registered_threads(Threads(2, 2, 1, AUTO, 2), machine) as ctl:
        for step in (5, 10):  # oversubscribed since the start: two checks
            fake.advance(CHECK_SECONDS)
            ctl.check(step, STEP)
        assert torch.get_num_threads() == 1
        assert [j.threads for j in machine.registry.jobs()] == [1]
    assert machine.registry.jobs() == []


@pytest.fixture
def scripted_controller(monkeypatch):
    """Training's threads=auto controller drops from 2 threads to 1 after two checks (10 steps),
    whatever the machine."""

    @contextmanager
    def scripted(threads):
        yield ThreadController(2, Script(1), torch.set_num_threads)

    monkeypatch.setattr(train_module, "registered_threads", scripted)
    monkeypatch.setattr(posbench.system.threads, "CHECK_SECONDS", 0.0)


def test_training_records_the_controllers_changes(tiny, tmp_path, scripted_controller):
    results = train(compose_config([*tiny, "threads=auto", "eval.lengths=[16]"]), tmp_path)
    changes = results["train"]["thread_changes"]
    assert changes == [{"step": 2 * CHECK_MIN_STEPS, "threads": 1, "why": changes[0]["why"]}]


def test_a_compiled_run_keeps_its_threads(tiny, tmp_path, scripted_controller, monkeypatch):
    # A new thread count would compile the model again (dynamo guards on it). What keeps the
    # count is train.compile, not the compiled model: the model runs uncompiled here, sparing
    # inductor's seconds (tests/test_precision.py compiles runs).
    monkeypatch.setattr(
        posbench.training.train_loop, "compile_for_training", lambda model, *_, **__: (model, 0.0)
    )
    overrides = [*tiny, "threads=auto", "eval.lengths=[16]", "train.compile=true"]
    results = train(compose_config(overrides), tmp_path)
    assert results["train"]["thread_changes"] == []


def test_a_resumed_run_records_the_changes_made_before_it_stopped(
    tiny, tmp_path, monkeypatch, scripted_controller
):  # each part drops 2 -> 1 after two checks (10 steps)
    overrides = [*tiny, "threads=auto", "eval.lengths=[16]", "train.steps=16"]
    overrides += ["train.checkpoint_every=12"]
    draws, train_batch = itertools.count(1), Corpus.train_batch

    def crashing_at_the_14th_batch(self, *args):
        if next(draws) == 14:
            raise RuntimeError("simulated crash")
        return train_batch(self, *args)

    monkeypatch.setattr(Corpus, "train_batch", crashing_at_the_14th_batch)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(compose_config(overrides), tmp_path)
    monkeypatch.setattr(Corpus, "train_batch", train_batch)
    results = train(compose_config([*overrides, "train.resume=true"]), tmp_path)
    # The change at step 10 is in the step-12 checkpoint; the resumed part, 4 steps, made none.
    assert [c["step"] for c in results["train"]["thread_changes"]] == [2 * CHECK_MIN_STEPS]


def test_a_run_with_a_count_the_user_set_records_no_changes(tiny, tmp_path):
    results = train(compose_config([*tiny, "eval.lengths=[16]"]), tmp_path)
    assert results["train"]["thread_changes"] == []
