"""Data-parallel training: torchrun and SLURM ranks, global batches split among ranks and
micro-batches, one run directory, and faults that stop every rank."""

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from conftest import (
    RANK_ENV,
    TINY,
    TINY_REVERSE_STRING,
    TINY_RUN,
    TINY_SYNTHETIC,
    built_once,
    child_processes,
    forked_python,
)
from forkserver import POSBENCH
from safetensors.torch import load_file

import posbench.training.checkpoint
from posbench.config import compose_config, position_sampler, validate
from posbench.data import load_data
from posbench.errors import PosbenchError
from posbench.model import build_model
from posbench.runs.directory import CHECKPOINT_FILE
from posbench.system import distributed
from posbench.system.threads import jobs_at_once
from posbench.training.checkpoint import load_checkpoint
from posbench.training.train import make_optimizer, train
from posbench.training.train_loop import TrainingInterrupted, seed_dropout, train_step

RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR")
# 20 steps of a tiny run, one thread per rank, one short evaluation.
SHORT_RUN = [
    *TINY_RUN,
    "train.steps=20",
    "train.log_every=1",
    "eval.lengths=[16]",
    "eval.max_tokens=1024",
    "threads=1",
]
SHORT = [*SHORT_RUN, *TINY_SYNTHETIC]


@pytest.fixture
def single_process(monkeypatch):
    """An environment that no launcher started: no torchrun or submitit variables."""
    for name in (*RANK_VARIABLES, "MASTER_PORT", "SUBMITIT_EXECUTOR"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_a_process_no_launcher_started_is_a_single_rank(single_process):
    assert distributed.launch() is None
    assert distributed.world_size() == 1 and distributed.rank() == 0


def test_torchrun_variables_give_the_rank_and_its_neighbours(single_process):
    environ = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    environ |= {"MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29400"}
    ranks = distributed.launch(environ)
    assert ranks == distributed.Launch(3, 4, 1, 2, "10.0.0.7", 29400)


def fake_slurm_task(monkeypatch, procid: int, localid: int) -> None:
    """A task of an 8-task SLURM job on two nodes, as submitit starts it."""
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[017-018]")
    monkeypatch.setenv("SLURM_NODELIST", "gpu[017-018]")
    monkeypatch.setenv("SLURM_NODEID", str(procid // 4))
    monkeypatch.setenv("SLURM_PROCID", str(procid))
    monkeypatch.setenv("SLURM_LOCALID", str(localid))


def test_a_slurm_task_takes_its_rank_from_slurm_and_rank_0s_node_as_master(single_process):
    pytest.importorskip("submitit")
    fake_slurm_task(single_process, procid=5, localid=1)
    ranks = distributed.launch()
    assert (ranks.rank, ranks.world_size, ranks.local_rank, ranks.local_world_size) == (5, 8, 1, 4)
    assert ranks.master_addr == "gpu017"
    fake_slurm_task(single_process, procid=0, localid=0)
    assert distributed.launch().master_port == ranks.master_port  # from the job id, on all


def test_a_slurm_task_exports_torchrun_variables_so_threads_divide_among_local_ranks(
    single_process,
):
    pytest.importorskip("submitit")
    fake_slurm_task(single_process, procid=6, localid=2)
    environ = {}
    distributed.export(distributed.launch(), environ)
    assert environ["RANK"] == "6" and environ["WORLD_SIZE"] == "8"
    assert environ["LOCAL_RANK"] == "2" and environ["MASTER_ADDR"] == "gpu017"
    assert distributed.launch(environ) == distributed.launch()
    assert jobs_at_once(None, environ) == 4  # threads=auto: the node's cores / its 4 ranks


def test_a_single_task_slurm_job_is_a_single_rank(single_process):
    pytest.importorskip("submitit")
    fake_slurm_task(single_process, procid=0, localid=0)
    single_process.setenv("SLURM_NTASKS", "1")
    single_process.setenv("SLURM_JOB_NUM_NODES", "1")
    assert distributed.launch() is None


def test_the_collective_timeout_is_read_from_the_environment_in_seconds():
    assert distributed.timeout({}).total_seconds() == distributed.DEFAULT_TIMEOUT_S
    assert distributed.timeout({distributed.TIMEOUT_ENV: "90"}).total_seconds() == 90
    with pytest.raises(PosbenchError, match="POSBENCH_DIST_TIMEOUT must be a positive") as err:
        distributed.timeout({distributed.TIMEOUT_ENV: "soon"})
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("world", "overrides", "message"),
    [
        ("2", ["train.batch_size=15"], r"train.batch_size \(15\) must be divisible by the number "),
        ("1", ["train.batch_size=16", "train.grad_accum=3"], r"ranks \(1\) x train.grad_accum \(3"),
        ("1", ["train.grad_accum=0"], "train.grad_accum must be positive"),
    ],
)
def test_a_global_batch_that_does_not_split_evenly_is_one_error_line(
    single_process, world, overrides, message
):
    single_process.setenv("RANK", "0")
    single_process.setenv("WORLD_SIZE", world)
    with pytest.raises(PosbenchError, match=message) as err:
        validate(compose_config([*TINY, *overrides]))
    assert "\n" not in str(err.value)


def gradients_of_one_step(overrides: list[str]) -> list[torch.Tensor]:
    cfg = compose_config([*SHORT_RUN, *overrides])
    torch.manual_seed(0)
    model = build_model(cfg.model, cfg.encoding)
    sampler = torch.Generator().manual_seed(0)
    optimizer, positions = make_optimizer(model, cfg.train), position_sampler(cfg)
    train_step(model, optimizer, load_data(cfg.data), sampler, 0, cfg.train, "fp32", positions)
    return [p.grad for p in model.parameters()]


@pytest.mark.parametrize(
    "data",
    [
        TINY_SYNTHETIC,
        ["data=copy"],
        [*TINY_SYNTHETIC, "encoding=rope", "train.random_positions=256"],
    ],
    ids=["corpus", "task", "random_positions"],
)
def test_micro_batches_give_the_gradient_of_the_whole_batch(single_process, cache_dir, data):
    """The loss is the mean over the global batch, however it is split (a task's: over its
    answer bytes; with randomized positions, each sequence keeps its own)."""
    whole = gradients_of_one_step(data)
    split = gradients_of_one_step([*data, "train.grad_accum=4"])
    for a, b in zip(whole, split, strict=True):
        torch.testing.assert_close(a, b)


def test_each_rank_draws_its_own_dropout_masks_and_a_step_always_the_same(monkeypatch):
    masks = {}
    for rank in (0, 1):
        monkeypatch.setattr(distributed, "rank", lambda rank=rank: rank)
        for step in (0, 1):
            seed_dropout(0, step)
            masks[rank, step] = torch.nn.functional.dropout(torch.ones(256), 0.5)
    assert len({tuple(mask.tolist()) for mask in masks.values()}) == 4
    seed_dropout(0, 0)  # rank 1 again
    assert torch.equal(torch.nn.functional.dropout(torch.ones(256), 0.5), masks[1, 0])


def signal_after_the_first_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM to this process as soon as training's first checkpoint is written: after the
    ranks agreed whether to stop at that step."""
    save = posbench.training.checkpoint.save_checkpoint
    written = []

    def save_then_signal(*args, **kwargs):
        written.append(save(*args, **kwargs))
        if len(written) == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return written[-1]

    monkeypatch.setattr(posbench.training.checkpoint, "save_checkpoint", save_then_signal)


def test_a_signal_after_the_ranks_agreed_on_a_step_stops_them_at_the_next_one(
    single_process, tmp_path, cache_dir
):
    """A signal that reaches a rank after this step's agreement (here during its checkpoint)
    counts at the next step, where every rank agrees on it: one rank stopping alone would
    leave the others waiting at that step's collectives. That step is checkpointed."""
    signal_after_the_first_checkpoint(single_process)
    with pytest.raises(TrainingInterrupted) as stopped:
        train(compose_config([*SHORT, "train.checkpoint_every=5"]), tmp_path / "run")
    assert stopped.value.step == 6
    assert load_checkpoint(tmp_path / "run" / CHECKPOINT_FILE)["progress"]["step"] == 6


def test_a_signal_during_the_last_checkpoint_stops_the_run_before_its_evaluation(
    single_process, tmp_path, cache_dir
):
    signal_after_the_first_checkpoint(single_process)
    with pytest.raises(TrainingInterrupted) as stopped:
        train(compose_config([*SHORT, "train.checkpoint_every=0"]), tmp_path / "run")
    assert stopped.value.step == 20
    assert load_checkpoint(tmp_path / "run" / CHECKPOINT_FILE)["progress"]["step"] == 20
    assert not (tmp_path / "run" / "results.json").exists()


# ------------------------------------------------------------------- through torchrun


def torchrun(
    nproc: int,
    *args: str,
    cwd: Path,
    program: Sequence[str] = (),
    options: Sequence[str] = (),
    forked: bool = True,
) -> subprocess.Popen:
    """``torchrun --standalone --nproc_per_node=N [options] -m posbench ARGS`` with this
    interpreter (or ``program``, a script, in place of ``-m posbench``). With ``forked``, each
    rank is forked from a warm interpreter in a rank's environment (conftest.forked_python with
    RANK_ENV, after ``--no-python``: without the 4.5 s of CPU a rank spends on its imports),
    else a process of its own."""
    python = ["--no-python", *forked_python(RANK_ENV)] if forked else []
    program = list(program) or (POSBENCH if forked else ["-m", "posbench"])
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", *options]
    return subprocess.Popen(
        [*command, f"--nproc_per_node={nproc}", *python, *program, *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **RANK_ENV},
    )


def wait_for_file(path: Path, process: subprocess.Popen, timeout: float = 300) -> None:
    """Until ``path`` exists while ``process`` (a torchrun) runs. It failing to exit, or
    ``timeout`` seconds passing (five minutes: torchrun's start took over two on a 2-core
    machine running a sweep beside the suite), fails the test with its stderr, the run stopped
    first: stderr is read to its end, which an endless run never reaches."""
    deadline = time.monotonic() + timeout
    while not path.is_file():
        if process.poll() is not None or time.monotonic() > deadline:
            process.terminate()  # torchrun passes SIGTERM on to its ranks
            pytest.fail(f"no {path} while the run ran: {finished(process)[1]}")
        time.sleep(0.01)


def test_waiting_for_a_file_an_endless_run_never_writes_fails_and_stops_it(tmp_path):
    """A run that never writes the file fails the test in ``timeout`` seconds, not by a wait on
    its stderr for ever (which hung CI's suite past its limit when torchrun started slowly)."""
    endless = [sys.executable, "-c", "import time; time.sleep(600)"]
    process = subprocess.Popen(endless, stderr=subprocess.PIPE, text=True)
    with pytest.raises(pytest.fail.Exception, match="while the run ran"):
        wait_for_file(tmp_path / "never", process, timeout=0.5)
    assert process.poll() is not None


def finished(process: subprocess.Popen, timeout: float = 120) -> tuple[int, str]:
    """Exit code and stderr, the run given at most ``timeout`` seconds (two minutes)."""
    _, stderr = process.communicate(timeout=timeout)
    return process.returncode, stderr


def only_run(root: Path) -> Path:
    """The one run directory below ``root``, checking that no rank made another."""
    results = list(root.rglob("results.json"))
    assert len(results) == 1, results
    hydra_dirs = list(root.rglob(".hydra"))
    assert hydra_dirs == [results[0].parent / ".hydra"], hydra_dirs
    return results[0].parent


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "model.safetensors")


def assert_same_weights(a: Path, b: Path) -> None:
    first, second = weights(a), weights(b)
    assert first.keys() == second.keys()
    for key in first:
        torch.testing.assert_close(first[key], second[key], msg=key)


# An algorithmic task's rows run in width slices, each rank its own number of them, at
# randomized positions drawn for the global batch.
TASK_AT_RANDOM_POSITIONS = [*TINY_REVERSE_STRING, "train.steps=20", "train.random_positions=64"]
# Long enough that SIGTERM, sent once the first checkpoint exists, arrives mid-run.
CHECKPOINTED = [*SHORT, "train.steps=60", "train.checkpoint_every=5", "train.val_every=50"]
# The two-rank runs that the tests compare with, trained through to the end: rope (the
# default); fox: a bias from each layer's content, with a gate per layer; hybrid: each layer's
# own encoding; a task; the run the SIGTERM test stops and resumes.
TWO_RANK_RUNS = {
    "rope": [*SHORT, "encoding=rope"],
    "fox": [*SHORT, "encoding=fox"],
    "hybrid": [*SHORT, "encoding=hybrid"],
    "reverse_string": TASK_AT_RANDOM_POSITIONS,
    "checkpointed": CHECKPOINTED,
}
# `posbench train <args>` for each of TWO_RANK_RUNS (given as JSON) in turn, each in a directory
# of its own that it names the run in (Hydra's default, claimed by rank 0). Each rank runs it.
TRAIN_EACH = """
import json, os, sys

from posbench.cli import main

for name, args in json.loads(sys.argv[1]).items():
    os.makedirs(name, exist_ok=True)
    os.chdir(name)
    main(["train", *args])
    os.chdir("..")
"""


@pytest.fixture
def two_rank_runs(tmp_path_factory, cache_dir) -> Path:
    """TWO_RANK_RUNS, trained by two ranks in one torchrun launch for the whole session (a
    launch's agent imports torch, about 2 s of CPU; a run in its forked ranks takes about 2 s):
    ``<dir>/<name>/`` holds each run's directory."""

    def launch(root: Path) -> None:
        (root / "train_each.py").write_text(TRAIN_EACH)
        runs = json.dumps(TWO_RANK_RUNS)
        process = torchrun(2, runs, cwd=root, program=["train_each.py"])
        code, stderr = finished(process, timeout=600)
        assert code == 0, stderr

    return built_once(tmp_path_factory, "two-rank-runs", launch)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rope", "fox", "hybrid", "reverse_string"])
def test_two_ranks_and_two_micro_batches_on_one_process_reach_the_same_weights(
    tmp_path, cache_dir, two_rank_runs, name
):
    run = TWO_RANK_RUNS[name]
    two = only_run(two_rank_runs / name)
    one = tmp_path / "one"
    train(compose_config([*run, "train.grad_accum=2"]), one)
    assert_same_weights(two, one)
    results = [json.loads((d / "results.json").read_text()) for d in (two, one)]
    assert [r["world_size"] for r in results] == [2, 1]
    assert results[0]["train"]["final_loss"] == pytest.approx(results[1]["train"]["final_loss"])
    assert results[0]["eval"][0]["ppl"] == pytest.approx(results[1]["eval"][0]["ppl"])


# posbench on a slow disk: rank 0's checkpoint takes two seconds to write. Each rank records
# the step of the checkpoint on disk when it leaves, which a launcher that kills the others
# as soon as one rank exits would leave behind.
SLOW_CHECKPOINT_DISK = """
import json, os, sys, time
from pathlib import Path

import posbench.training.checkpoint
from posbench.training.checkpoint import load_checkpoint
from posbench.cli import main

save = posbench.training.checkpoint.save_checkpoint

def slow_save(*args, **kwargs):
    time.sleep(2)
    return save(*args, **kwargs)

posbench.training.checkpoint.save_checkpoint = slow_save
checkpoint = Path(sys.argv.pop(1))  # the rest is posbench's command line
try:
    main()
finally:
    step = load_checkpoint(checkpoint)["progress"]["step"]
    Path(f"left_rank{os.environ['RANK']}.json").write_text(json.dumps(step))
"""


@pytest.mark.slow
def test_a_two_rank_run_stopped_by_sigterm_exits_after_its_checkpoint_and_resumes_alike(
    tmp_path, cache_dir, two_rank_runs
):
    """Two torchrun launches of two ranks (each launch's agent imports torch, its ranks are
    forked): the run stopped, its resumption; the run straight through is one of the session's
    ``two_rank_runs``. The stopped run must still be training when its first checkpoint is on
    disk: its 60 steps, each checkpoint two seconds on its slow disk."""
    checkpoint = tmp_path / "stopped" / CHECKPOINT_FILE
    (tmp_path / "slow_disk.py").write_text(SLOW_CHECKPOINT_DISK)
    program = ["slow_disk.py", str(checkpoint)]
    stopped = torchrun(
        2, "train", *CHECKPOINTED, "hydra.run.dir=stopped", cwd=tmp_path, program=program
    )
    wait_for_file(checkpoint, stopped)
    stopped.send_signal(signal.SIGTERM)  # torchrun passes it on to every rank
    code, stderr = finished(stopped)
    assert code != 0
    assert stderr.count("interrupted: SIGTERM") == 1, stderr
    step = load_checkpoint(checkpoint)["progress"]["step"]
    assert 5 <= step < 60
    # No rank left before the stop step's checkpoint was on disk.
    left = [json.loads((tmp_path / f"left_rank{rank}.json").read_text()) for rank in (0, 1)]
    assert left == [step, step]
    assert not (tmp_path / "stopped" / "results.json").exists()
    time.sleep(1 - time.time() % 1)  # TensorBoard orders event files by their second
    resumed = torchrun(2, "train", "--resume", "stopped", cwd=tmp_path)
    code, stderr = finished(resumed)
    assert code == 0, stderr
    assert_same_weights(tmp_path / "stopped", only_run(two_rank_runs / "checkpointed"))


@pytest.mark.slow
def test_a_bad_override_under_torchrun_is_one_error_line_and_every_rank_exits_nonzero(tmp_path):
    code, stderr = finished(torchrun(2, "train", "train.stpes=3", cwd=tmp_path))
    assert code != 0
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "did you mean train.steps?" in errors[0], stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_a_failure_on_rank_0_after_the_ranks_met_stops_them_all_with_one_error_line(
    tmp_path, cache_dir
):
    (tmp_path / "empty.txt").write_text("")
    run = torchrun(2, "train", *SHORT_RUN, "data=text", "data.path=empty.txt", cwd=tmp_path)
    code, stderr = finished(run)
    assert code != 0
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "data.path" in errors[0], stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt"]  # no run directory left


def rank_process(torchrun_pid: int, rank: int) -> int:
    """The pid of the worker torchrun started as ``rank`` (Linux: read from /proc)."""
    for child in child_processes(torchrun_pid):
        try:
            environ = (child / "environ").read_bytes().split(b"\0")
        except OSError:
            continue  # exited meanwhile
        if f"RANK={rank}".encode() in environ:
            return int(child.name)
    raise AssertionError(f"no rank {rank} under torchrun {torchrun_pid}")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc (Linux)")
def test_a_rank_killed_mid_training_stops_the_others_with_one_error_line(tmp_path, cache_dir):
    endless = [*SHORT, "train.steps=100000", "train.checkpoint_every=5", "hydra.run.dir=run"]
    # torchrun's agent SIGTERMs the ranks left once it sees one die (every 0.1 s by default):
    # on a loaded machine that could reach rank 0 before its next all-reduce finds the peer
    # gone, and rank 0 would stop as "terminated". What is tested is rank 0 finding it out.
    # Ranks of their own: a SIGKILL cannot pass through a fork server's client.
    run = torchrun(
        2, "train", *endless, cwd=tmp_path, options=["--monitor-interval=5"], forked=False
    )
    checkpoint = tmp_path / "run" / CHECKPOINT_FILE
    wait_for_file(checkpoint, run)
    os.kill(rank_process(run.pid, 1), signal.SIGKILL)
    code, stderr = finished(run)
    assert code != 0
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "lost the other ranks" in errors[0], stderr
    assert "Traceback" not in stderr.split("error: ")[0]  # torchrun's own summary comes after
