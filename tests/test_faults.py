"""Faults met through the command line: stop signals, kill -9, divergence, bad input."""

import json
import logging
import os
import random
import shlex
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from conftest import TINY, TINY_RUN, TINY_SYNTHETIC, command_pid, forked_posbench, posbench
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from posbench import cli
from posbench.commands import eval as eval_command
from posbench.commands import train as train_command
from posbench.config import compose_config
from posbench.model import build_model
from posbench.runs.directory import CHECKPOINT_FILE, save_config, save_weights, saved_config
from posbench.training.checkpoint import FORMAT, load_checkpoint

pytestmark = pytest.mark.slow

QUICK_RUN = [*TINY_RUN, "train.log_every=1", "eval.lengths=[16]", "eval.max_tokens=1024"]
QUICK = [*QUICK_RUN, *TINY_SYNTHETIC]
ENDLESS = [*QUICK, "train.steps=100000"]  # always stopped long before its end


def start_training(
    cwd: Path, *overrides: str, command: Sequence[str] = ("posbench",)
) -> subprocess.Popen:
    """``posbench train OVERRIDES`` started in ``cwd`` (``command``: what stands for
    ``posbench``, e.g. conftest.forked_posbench())."""
    return subprocess.Popen(
        [*command, "train", *overrides],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_checkpoint(path: Path, process: subprocess.Popen, newer_than: int = -1) -> None:
    """Until ``path`` exists with an mtime (ns) above ``newer_than``."""
    deadline = time.monotonic() + 240
    while not (path.is_file() and path.stat().st_mtime_ns > newer_than):
        assert process.poll() is None, process.stderr.read()
        assert time.monotonic() < deadline, "no checkpoint written"
        time.sleep(0.05)


def loss_steps(run_dir: Path) -> list[int]:
    events = EventAccumulator(str(run_dir))
    events.Reload()
    return [e.step for e in events.Scalars("train/loss")]


def results_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def assert_loads_into_the_model(run_dir: Path) -> int:
    """The checkpoint loads (without running code) into the run's model; returns its step."""
    checkpoint = load_checkpoint(run_dir / CHECKPOINT_FILE)
    cfg = saved_config(run_dir)
    build_model(cfg.model, cfg.encoding).load_state_dict(checkpoint["model"])
    return checkpoint["progress"]["step"]


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
def test_a_stop_signal_checkpoints_says_how_to_resume_and_exits_128_plus_its_number(
    tmp_path, cache_dir, stop_signal
):
    run_dir = tmp_path / "run"
    # SIGTERM to the installed command's own process; SIGINT through the fork server's client,
    # which passes it on to the command (2.5 s of imports less)
    command = forked_posbench() if stop_signal == signal.SIGINT else ("posbench",)
    overrides = [*ENDLESS, "train.checkpoint_every=5", f"hydra.run.dir={run_dir}"]
    process = start_training(tmp_path, *overrides, command=command)
    wait_for_checkpoint(run_dir / CHECKPOINT_FILE, process)
    process.send_signal(stop_signal)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + stop_signal
    assert "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    step = assert_loads_into_the_model(run_dir)
    assert last.startswith("interrupted:") and f"at step {step};" in last
    command = shlex.split(last.split("resume with: ")[1])
    assert command == ["posbench", "train", "--resume", str(run_dir.resolve())]
    if stop_signal == signal.SIGINT:  # the printed command continues the run to its end
        resumed = posbench(*command[1:], f"train.steps={step + 3}", cwd=tmp_path)
        assert resumed.returncode == 0, resumed.stderr
        assert results_of(run_dir)["status"] == "ok"
        assert loss_steps(run_dir) == list(range(1, step + 4))


@pytest.mark.skipif(not Path("/proc/self/cwd").exists(), reason="reads /proc (Linux)")
def test_kill_9_at_random_moments_leaves_a_checkpoint_that_loads_and_resumes(tmp_path, cache_dir):
    """A run killed three times, then resumed. A SIGKILL cannot pass through the fork server's
    client: it goes to the forked command itself (command_pid), whose client then exits."""
    run_dir, path = tmp_path / "run", tmp_path / "run" / CHECKPOINT_FILE
    moments = random.Random(0)
    steps = []
    for _ in range(3):
        previous = path.stat().st_mtime_ns if path.exists() else -1
        process = start_training(
            tmp_path,
            *ENDLESS,
            "train.checkpoint_every=1",  # a checkpoint write is under way at most moments
            "train.resume=true",
            f"hydra.run.dir={run_dir}",
            command=forked_posbench(),
        )
        wait_for_checkpoint(path, process, newer_than=previous)
        time.sleep(moments.uniform(0, 0.5))
        os.kill(command_pid(process, tmp_path), signal.SIGKILL)
        assert process.wait(timeout=60) != 0
        steps.append(assert_loads_into_the_model(run_dir))
    assert steps == sorted(steps) and steps[0] > 0
    finished = posbench("train", "--resume", run_dir, f"train.steps={steps[-1] + 2}", cwd=tmp_path)
    assert finished.returncode == 0, finished.stderr
    assert loss_steps(run_dir) == list(range(1, steps[-1] + 3))  # no step twice
    assert not [p for p in run_dir.iterdir() if p.name.endswith(".tmp")]


def test_a_diverging_run_exits_nonzero_with_one_line_and_records_its_status(tmp_path, cache_dir):
    run_dir = tmp_path / "run"
    result = posbench(
        "train", *QUICK, "train.lr=1e30", f"hydra.run.dir={run_dir}", cwd=tmp_path, check=False
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: training diverged at step")
    assert results_of(run_dir)["status"] == "diverged"


def test_a_diverging_job_does_not_stop_the_rest_of_a_sweep(tmp_path, cache_dir):
    sweep = tmp_path / "sweep"
    overrides = [*QUICK, "train.steps=10", "train.lr=1e30,1e-2", f"hydra.sweep.dir={sweep}"]
    posbench("train", "-m", *overrides, cwd=tmp_path, check=False)
    statuses = sorted(results_of(p.parent)["status"] for p in sweep.glob("*/results.json"))
    assert statuses == ["diverged", "ok"]


# --------------------------------------------------------------------------- bad input


def a_dir(tmp_path: Path) -> Path:
    (tmp_path / "run").mkdir()
    return tmp_path / "run"


def a_run_config(tmp_path: Path) -> Path:
    run_dir = a_dir(tmp_path)
    save_config(run_dir, compose_config(TINY))
    return run_dir


def weights_of_another_shape(tmp_path: Path) -> Path:
    run_dir = a_run_config(tmp_path)
    other = compose_config([*TINY, "model.d_model=64"])
    save_weights(run_dir, build_model(other.model, other.encoding))
    return run_dir


def a_truncated_checkpoint(tmp_path: Path) -> Path:
    run_dir = a_run_config(tmp_path)
    (run_dir / CHECKPOINT_FILE).write_bytes(b"PK\x03\x04 truncated")
    return run_dir


class RunsCommand:
    def __reduce__(self):
        return (open, ("marker", "w"))  # relative: the test checks the working directory


def a_checkpoint_that_would_run_code(tmp_path: Path) -> Path:
    run_dir = a_run_config(tmp_path)
    torch.save({"format": FORMAT, "model": RunsCommand()}, run_dir / CHECKPOINT_FILE)
    return run_dir


def a_file(tmp_path: Path) -> Path:
    (tmp_path / "file").write_text("")
    return tmp_path / "file"


# Mistakes caught while composing the config, before Hydra starts: checked in-process
# (test_cli.py runs this path through the installed command).
CONFIG_ERRORS = [
    ("unknown model", ["model=nope"], "unknown model 'nope'; choose one of"),
    ("unknown data", ["data=nope"], "unknown data 'nope'; choose one of"),
    (
        "n_head not dividing d_model",
        ["encoding=none", "model.d_model=30", "model.n_head=4"],
        "model.n_head (4) must divide model.d_model (30)",
    ),
    ("zero batch size", ["train.batch_size=0"], "train.batch_size must be positive"),
    ("zero seq_len", ["train.seq_len=0"], "train.seq_len must be positive"),
    ("zero eval length", ["eval.lengths=[0,16]"], "eval.lengths must be positive integers"),
    ("negative lr", ["train.lr=-1"], "train.lr must be positive"),
    ("negative checkpoint interval", ["train.checkpoint_every=-1"], "must be >= 0"),
]


@pytest.mark.parametrize(
    ("overrides", "message"), [c[1:] for c in CONFIG_ERRORS], ids=[c[0] for c in CONFIG_ERRORS]
)
def test_config_mistakes_are_one_error_line_before_anything_is_created(
    tmp_path, monkeypatch, capsys, overrides, message
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        cli.main(["train", *overrides])
    assert stopped.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    assert not list(tmp_path.iterdir())


def test_a_file_system_error_while_training_is_one_error_line(tmp_path, monkeypatch, capsys):
    def full_disk(cfg, run_dir, *_):
        raise OSError(28, "No space left on device", str(run_dir))

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(train_command, "train", full_disk)
    # The job configures logging (a train.log in the run directory, which the failed run then
    # removes): give the next tests in this process the handlers they had.
    before = list(logging.root.handlers)
    monkeypatch.setattr(logging.root, "handlers", list(before))
    monkeypatch.setattr(logging.root, "level", logging.root.level)
    with pytest.raises(SystemExit) as stopped:
        cli.main(["train", *TINY_RUN])
    for handler in set(logging.root.handlers) - set(before):
        handler.close()
    assert stopped.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "No space left" in lines[0], lines


# (what is wrong, the command line (given tmp_path), what the error line must say)
BAD_INPUT = [
    (
        "missing data path",
        lambda t: ["train", *QUICK_RUN, "data=text", f"data.path={t / 'none.txt'}"],
        "matches no file",
    ),
    (
        "run directory without weights",
        lambda t: ["eval", "--length", "16", "--run", str(a_dir(t))],
        "holds no model.safetensors",
    ),
    (
        "weights of another model shape",
        lambda t: ["eval", "--length", "16", "--run", str(weights_of_another_shape(t))],
        "d_model=64 but config.yaml says d_model=32",
    ),
    (
        "resume of a directory that holds no run",
        lambda t: ["train", "--resume", str(a_dir(t))],
        "holds no config.yaml, so it is not a run directory",
    ),
    (
        "truncated checkpoint",
        lambda t: ["train", "--resume", str(a_truncated_checkpoint(t))],
        "not a readable checkpoint",
    ),
    (
        "checkpoint that would run code",
        lambda t: ["train", "--resume", str(a_checkpoint_that_would_run_code(t))],
        "refusing to load",
    ),
    (
        "output directory below a file",
        lambda t: ["train", f"hydra.run.dir={a_file(t)}/run"],
        "is a file",
    ),
]


@pytest.mark.parametrize(
    ("args", "message"), [c[1:] for c in BAD_INPUT], ids=[c[0] for c in BAD_INPUT]
)
def test_bad_input_is_one_error_line_a_nonzero_exit_and_leaves_nothing_behind(
    tmp_path, cache_dir, args, message
):
    command = args(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    result = posbench(*command, cwd=tmp_path, check=False)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and message in lines[0]
    assert not (tmp_path / "marker").exists()
    added = [p for p in sorted(tmp_path.rglob("*")) if p not in before]
    assert all(p.is_relative_to(tmp_path / "run") for p in added), added  # Hydra's own notes


@pytest.mark.parametrize(
    "args",
    [["--debug", "train", "train.steps=-5"], ["eval", "--debug", "--length", "16", "--run", "x"]],
    ids=["posbench --debug train", "posbench eval --debug"],
)
def test_debug_shows_the_traceback_behind_the_error_line(tmp_path, monkeypatch, capsys, args):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HYDRA_FULL_ERROR", "0")  # restored after --debug sets it to 1
    with pytest.raises(SystemExit) as stopped:
        cli.main(args)
    err = capsys.readouterr().err
    assert stopped.value.code == 2
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("error: ")


def test_hydra_full_error_shows_the_traceback_of_a_failing_job(tmp_path, cache_dir):
    overrides = [*QUICK_RUN, "data=text", "data.path=none.txt"]
    result = posbench("train", *overrides, cwd=tmp_path, check=False, env={"HYDRA_FULL_ERROR": "1"})
    assert result.returncode != 0
    assert "Traceback" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: data.path")


def test_a_run_that_fails_on_its_data_leaves_no_run_directory(tmp_path, cache_dir):
    (tmp_path / "empty.txt").write_text("")
    result = posbench(
        "train", *QUICK_RUN, "data=text", "data.path=empty.txt", cwd=tmp_path, check=False
    )
    assert result.returncode != 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt"]


def test_ctrl_c_anywhere_else_in_the_cli_is_one_line_and_exit_130(monkeypatch, capsys):
    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(eval_command, "load_run_config", interrupted)
    with pytest.raises(SystemExit) as stopped:
        cli.main(["eval", "--length", "16", "--run", "some/run"])
    assert stopped.value.code == 130
    assert capsys.readouterr().err == "interrupted\n"


def test_sigterm_outside_the_training_loop_is_one_line_and_exit_143(monkeypatch, capsys):
    def terminated(*args):
        os.kill(os.getpid(), signal.SIGTERM)  # as `kill` or SLURM would, while loading a run

    handler_before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(eval_command, "load_run_config", terminated)
    with pytest.raises(SystemExit) as stopped:
        cli.main(["eval", "--length", "16", "--run", "some/run"])
    assert stopped.value.code == 143
    assert capsys.readouterr().err == "terminated\n"
    assert signal.getsignal(signal.SIGTERM) is handler_before  # main() leaves no handler behind
