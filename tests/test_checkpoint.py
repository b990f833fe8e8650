"""Checkpoints and resume: a stopped run continues exactly; faults never corrupt a run."""

import errno
import itertools
import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from conftest import TINY, TINY_SYNTHETIC
from safetensors.torch import load_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import posbench.training.checkpoint
from posbench.config import compose_config
from posbench.data import Corpus, WindowTask
from posbench.errors import PosbenchError
from posbench.runs.directory import CHECKPOINT_FILE, WEIGHTS_FILE, check_run_dir
from posbench.training.checkpoint import load_checkpoint
from posbench.training.resume import check_resumable
from posbench.training.train import train
from posbench.training.train_loop import Diverged, TrainingInterrupted

# 20 steps, a checkpoint every 5, the loss logged at every step.
SHORT = [
    *TINY,
    "train.steps=20",
    "train.checkpoint_every=5",
    "train.log_every=1",
    "train.val_every=10",
    "eval.lengths=[16]",
    "eval.max_tokens=1024",
]


@pytest.fixture
def short(cache_dir):
    return [*SHORT, f"data.cache_dir={cache_dir}"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory, cache_dir):
    """The uninterrupted reference run."""
    run_dir = tmp_path_factory.mktemp("straight")
    results = train(compose_config([*SHORT, f"data.cache_dir={cache_dir}"]), run_dir)
    return run_dir, results


def losses(run_dir: Path) -> list[tuple[int, float]]:
    events = EventAccumulator(str(run_dir))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars("train/loss")]


def at_batch(monkeypatch, call: int, action, source: type = Corpus) -> None:
    """Run ``action()`` when training draws its ``call``-th batch from a ``source`` (Corpus or
    WindowTask; a test-only injection)."""
    calls = itertools.count(1)
    train_batch = source.train_batch

    def sampling(self, *args):
        if next(calls) == call:
            action()
        return train_batch(self, *args)

    monkeypatch.setattr(source, "train_batch", sampling)


def resume_later(overrides: list[str], run_dir: Path) -> dict:
    """Resume as a new process would: in a later second than the stopped run's TensorBoard
    files. They are read in name order, `events.out.tfevents.<second>.<host>.<pid>.<n>`: within
    one second of one process the writer counter n decides, and "10" sorts before "9"."""
    time.sleep(1 - time.time() % 1)
    return train(compose_config([*overrides, "train.resume=true"]), run_dir)


def crash() -> None:
    raise RuntimeError("simulated crash")


def assert_same_run(run_dir: Path, reference: Path) -> None:
    weights, expected = load_file(run_dir / WEIGHTS_FILE), load_file(reference / WEIGHTS_FILE)
    assert weights.keys() == expected.keys()
    assert all(torch.equal(weights[k], expected[k]) for k in expected)
    assert losses(run_dir) == losses(reference)  # every step once, the same loss bit for bit
    ours, theirs = (json.loads((d / "results.json").read_text()) for d in (run_dir, reference))
    assert ours["eval"] == theirs["eval"]
    assert ours["train"]["final_loss"] == theirs["train"]["final_loss"]


def test_a_crashed_run_resumed_from_its_checkpoint_equals_an_uninterrupted_one(
    straight, short, tmp_path, monkeypatch
):
    at_batch(monkeypatch, 13, crash)  # after the step-10 checkpoint, steps 11-12 logged
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(compose_config(short), tmp_path)
    assert load_checkpoint(tmp_path / CHECKPOINT_FILE)["progress"]["step"] == 10
    monkeypatch.undo()
    resume_later(short, tmp_path)
    assert [step for step, _ in losses(tmp_path)] == list(range(1, 21))
    assert_same_run(tmp_path, straight[0])


@pytest.mark.parametrize(
    "scaling",
    [
        ["model.attention_scaling=ssmax"],
        ["model.attention_scaling=llama4", "model.attention_floor_scale=4"],
    ],
    ids=["ssmax", "llama4"],
)
def test_a_crashed_run_with_attention_scaling_resumed_equals_an_uninterrupted_one(
    scaling, short, tmp_path, monkeypatch
):
    overrides = [*short, *scaling]
    train(compose_config(overrides), tmp_path / "straight")
    at_batch(monkeypatch, 13, crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(compose_config(overrides), tmp_path / "run")
    monkeypatch.undo()
    resume_later(overrides, tmp_path / "run")
    assert_same_run(tmp_path / "run", tmp_path / "straight")


def test_a_crashed_task_run_resumed_from_its_checkpoint_equals_an_uninterrupted_one(
    tmp_path, monkeypatch
):
    """A task's batches come from the checkpointed sampler, so resuming redraws the same ones."""
    task = [*(o for o in SHORT if o not in TINY_SYNTHETIC), "data=copy", "data.val_examples=8"]
    reference = tmp_path / "straight"
    train(compose_config(task), reference)
    at_batch(monkeypatch, 13, crash, source=WindowTask)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(compose_config(task), tmp_path / "run")
    monkeypatch.undo()
    resume_later(task, tmp_path / "run")
    assert_same_run(tmp_path / "run", reference)


def test_a_crashed_run_with_dropout_resumed_equals_an_uninterrupted_one(
    short, tmp_path, monkeypatch
):
    overrides = [*short, "model.dropout=0.2"]
    train(compose_config(overrides), tmp_path / "straight")
    at_batch(monkeypatch, 8, crash)  # after the step-5 checkpoint
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(compose_config(overrides), tmp_path / "run")
    monkeypatch.undo()
    resume_later(overrides, tmp_path / "run")
    assert_same_run(tmp_path / "run", tmp_path / "straight")


def test_sigint_finishes_the_step_checkpoints_and_the_resumed_run_is_identical(
    straight, short, tmp_path, monkeypatch
):
    at_batch(monkeypatch, 12, lambda: os.kill(os.getpid(), signal.SIGINT))
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(TrainingInterrupted) as stopped:
        train(compose_config(short), tmp_path)
    assert stopped.value.step == 12 and stopped.value.exit_code == 130
    assert load_checkpoint(tmp_path / CHECKPOINT_FILE)["progress"]["step"] == 12
    assert signal.getsignal(signal.SIGINT) == handler  # restored
    monkeypatch.undo()
    resume_later(short, tmp_path)
    assert_same_run(tmp_path, straight[0])


def test_the_final_checkpoint_holds_everything_to_continue(straight):
    checkpoint = load_checkpoint(straight[0] / CHECKPOINT_FILE)
    assert checkpoint["progress"]["step"] == 20
    assert len(checkpoint["progress"]["recent_losses"]) == 1  # train.log_every
    assert {"model", "optimizer", "sampler", "progress"} <= checkpoint.keys()
    assert straight[1]["status"] == "ok"


def test_resuming_a_finished_run_can_extend_it_and_change_its_eval_lengths_ignoring_temp_files(
    straight, short, tmp_path
):
    for name in ("config.yaml", CHECKPOINT_FILE, "results.json"):
        (tmp_path / name).write_bytes((straight[0] / name).read_bytes())
    stale = tmp_path / f".{CHECKPOINT_FILE}.x1y2.tmp"  # what a kill -9 mid-write leaves
    stale.write_bytes(b"half a checkpoint")
    overrides = [*short, "train.resume=true", "train.steps=25", "eval.lengths=[16,32]"]
    results = train(compose_config(overrides), tmp_path)
    assert not stale.exists()
    assert results["train"]["steps"] == 25
    assert [r["length"] for r in results["eval"]] == [16, 32]
    assert [step for step, _ in losses(tmp_path)] == list(range(21, 26))


def test_resuming_refuses_a_config_change_that_would_alter_the_result(straight, short, tmp_path):
    for name in ("config.yaml", CHECKPOINT_FILE):
        (tmp_path / name).write_bytes((straight[0] / name).read_bytes())
    with pytest.raises(PosbenchError, match=r"train.lr=0.01, not 0.02") as err:
        train(compose_config([*short, "train.resume=true", "train.lr=0.02"]), tmp_path)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("compiled", [False, True])
def test_resuming_refuses_to_switch_train_compile_either_way(compiled, tmp_path):
    # A compiled step runs other kernels (fused, reordered sums): switching halfway would make a
    # run of neither kind, where an uninterrupted run is one of them.
    saved = compose_config([*TINY, f"train.compile={compiled}"])
    resumed = compose_config([*TINY, f"train.compile={not compiled}", "train.resume=true"])
    with pytest.raises(PosbenchError, match=f"train.compile={compiled}, not {not compiled}") as err:
        check_resumable(saved, resumed, tmp_path)
    assert "\n" not in str(err.value)


def test_a_fresh_run_refuses_a_directory_that_holds_a_checkpoint(straight, short, tmp_path):
    (tmp_path / CHECKPOINT_FILE).write_bytes((straight[0] / CHECKPOINT_FILE).read_bytes())
    with pytest.raises(PosbenchError, match="--resume"):
        train(compose_config(short), tmp_path)


def test_a_diverging_run_stops_keeps_its_last_good_checkpoint_and_says_so(short, tmp_path):
    cfg = compose_config([*short, "train.lr=1e30", "train.checkpoint_every=1"])
    with pytest.raises(Diverged) as err:
        train(cfg, tmp_path)
    message = str(err.value)
    assert "\n" not in message and "diverged at step" in message and "train.lr" in message
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["status"] == "diverged"
    assert results["train"]["diverged_at_step"] == err.value.step
    checkpoint = load_checkpoint(tmp_path / CHECKPOINT_FILE)
    assert checkpoint["progress"]["step"] == err.value.step - 1
    assert all(torch.isfinite(t).all() for t in checkpoint["model"].values())
    assert not (tmp_path / WEIGHTS_FILE).exists()


def test_a_checkpoint_write_failing_midway_keeps_the_previous_checkpoint(
    short, tmp_path, monkeypatch
):
    calls = itertools.count(1)
    save = torch.save

    def disk_fills_up(obj, path):
        if next(calls) == 2:  # the step-10 checkpoint
            Path(path).write_bytes(b"half a checkpoint")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        save(obj, path)

    monkeypatch.setattr(posbench.training.checkpoint.torch, "save", disk_fills_up)
    with pytest.raises(PosbenchError, match="No space left on device") as err:
        train(compose_config(short), tmp_path)
    assert "\n" not in str(err.value) and CHECKPOINT_FILE in str(err.value)
    assert load_checkpoint(tmp_path / CHECKPOINT_FILE)["progress"]["step"] == 5
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


class RunsCommand:
    """Unpickling this calls ``open(marker, "w")``: a stand-in for arbitrary code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_checkpoint_whose_pickle_would_run_code_is_refused_and_the_code_never_runs(tmp_path):
    path, marker = tmp_path / CHECKPOINT_FILE, tmp_path / "marker"
    torch.save({"format": posbench.training.checkpoint.FORMAT, "model": RunsCommand(marker)}, path)
    with pytest.raises(PosbenchError, match="refusing to load") as err:
        load_checkpoint(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (lambda good: good[: len(good) // 2], "not a readable checkpoint"),  # truncated
        (lambda good: b"", "not a readable checkpoint"),
        (lambda good: b"some text, not a checkpoint\n" * 10, "not a readable checkpoint"),
        (lambda good: None, "not a posbench checkpoint"),  # a torch file of something else
    ],
)
def test_a_truncated_or_foreign_checkpoint_is_one_line_naming_the_file(
    straight, tmp_path, content, message
):
    path = tmp_path / CHECKPOINT_FILE
    data = content((straight[0] / CHECKPOINT_FILE).read_bytes())
    if data is None:
        torch.save({"weights": torch.zeros(3)}, path)
    else:
        path.write_bytes(data)
    with pytest.raises(PosbenchError, match=message) as err:
        load_checkpoint(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_an_output_path_below_a_file_fails_before_training(short, tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(PosbenchError, match="cannot write to the run directory"):
        train(compose_config(short), tmp_path / "file" / "run")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_output_directory_fails_before_training(short, tmp_path):
    tmp_path.chmod(0o555)
    try:
        with pytest.raises(PosbenchError, match="cannot write to the run directory"):
            train(compose_config(short), tmp_path / "run")
    finally:
        tmp_path.chmod(0o755)


def test_evaluating_a_stopped_run_says_how_to_finish_it(straight, tmp_path):
    (tmp_path / CHECKPOINT_FILE).write_bytes((straight[0] / CHECKPOINT_FILE).read_bytes())
    with pytest.raises(PosbenchError, match="posbench train --resume"):
        check_run_dir(tmp_path)
