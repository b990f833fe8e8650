"""Where a run's metrics go (posbench/runs/loggers/): logger=tensorboard (the default), wandb, none.

The W&B logger is tested at its boundary with a stand-in ``wandb`` module, and end to end in
W&B's offline mode (no account, no network), reading back the ``.wandb`` file it writes.
"""

import json
import struct
import sys
import time
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

import pytest
from conftest import TINY, error_line, posbench

from posbench.commands.overrides import group_options
from posbench.config import compose_config
from posbench.runs import loggers
from posbench.runs.directory import SWEEP_MARKER
from posbench.runs.loggers import NoLogger, open_logger
from posbench.runs.loggers.wandb import RUN_FILE
from posbench.runs.tensorboard_log import EVAL_EVENTS_FILE, HPARAMS_EVENTS_FILE, TrainedLengths
from posbench.training.resume import changed_keys
from posbench.training.train import train

AT_16 = TrainedLengths.tokens(16)


def record(length, ppl, scaling="none", loss_by_position=()):
    return {
        "length": length,
        "stride": None,
        "ppl": ppl,
        "bits_per_byte": ppl / 10,
        "status": "ok",
        "scaling": scaling,
        "loss_by_position": [{"end": end, "nll": nll} for end, nll in loss_by_position],
    }


class FakeRun:
    """What posbench calls on a wandb run, recorded."""

    def __init__(self, **init):
        self.init, self.id = init, init.get("id") or "fresh-id"
        self.axes, self.rows, self.summary, self.exit_code = {}, [], {}, None

    def define_metric(self, name, step_metric):
        self.axes[name] = step_metric

    def log(self, row):
        self.rows.append(row)

    def finish(self, exit_code):
        self.exit_code = exit_code


@pytest.fixture
def fake_wandb(monkeypatch):
    """A stand-in ``wandb`` module; its ``runs`` are the FakeRuns wandb.init made."""
    runs = []

    def init(**kwargs):
        runs.append(FakeRun(**kwargs))
        return runs[-1]

    module = ModuleType("wandb")
    module.__spec__ = ModuleSpec("wandb", None)  # found, as an installed package is
    module.init, module.Image, module.runs = init, lambda figure: ("image", figure), runs
    monkeypatch.setitem(sys.modules, "wandb", module)
    return module


def wandb_run(run_dir, job_type="train", overrides=()):
    """Open and close the logger=wandb logger of a tiny config for ``run_dir``."""
    cfg = compose_config([*TINY, "logger=wandb", *overrides])
    with open_logger(cfg, run_dir, job_type=job_type):
        pass


def test_tensorboard_is_the_default_logger():
    assert compose_config().logger.name == "tensorboard"


def test_every_logger_option_is_the_logger_of_its_name():
    options = group_options("logger")
    assert [compose_config([f"logger={o}"]).logger.name for o in options] == options
    assert sorted(loggers.LOGGERS) == options


def test_every_logger_takes_the_calls_training_and_eval_make(fake_wandb, tmp_path):
    # The methods train and posbench eval call, on every logger.
    for name in loggers.LOGGERS:
        cfg = compose_config([*TINY, f"logger={name}"])
        with open_logger(cfg, tmp_path / name) as logger:
            logger.log_scalars({"train/loss": 1.0}, step=1)
            logger.flush()
            logger.log_evaluation([record(16, 2.0)], AT_16)
            logger.log_summary({"final_loss": 1.0})


def test_training_scalars_are_drawn_against_the_training_step(fake_wandb, tmp_path):
    cfg = compose_config([*TINY, "logger=wandb"])
    with open_logger(cfg, tmp_path) as logger:
        logger.log_scalars({"train/loss": 2.5, "train/lr": 0.01}, step=10)
    (run,) = fake_wandb.runs
    assert run.rows == [{"train/step": 10, "train/loss": 2.5, "train/lr": 0.01}]
    assert run.axes == {"train/loss": "train/step", "train/lr": "train/step"}


def test_eval_curves_are_drawn_against_the_length_from_left_to_right(fake_wandb, tmp_path):
    records = [
        record(32, 3.0, loss_by_position=[(16, 1.5), (32, 1.75)]),
        record(16, 2.0, loss_by_position=[(16, 1.25)]),
        record(32, 2.5, scaling="yarn"),
    ]
    cfg = compose_config([*TINY, "logger=wandb"])
    with open_logger(cfg, tmp_path) as logger:
        logger.log_evaluation(records, AT_16)
    (run,) = fake_wandb.runs
    *rows, figure = run.rows
    assert rows == [
        {"eval/length": 16, "eval/ppl": 2.0, "eval/bits_per_byte": 0.2},
        {
            "eval/length": 32,
            "eval/ppl": 3.0,
            "eval/bits_per_byte": 0.3,
            "eval/ppl/yarn": 2.5,
            "eval/bits_per_byte/yarn": 0.25,
        },
        {"eval/position": 16, "eval/loss_by_position/L32": 1.5, "eval/loss_by_position/L16": 1.25},
        {"eval/position": 32, "eval/loss_by_position/L32": 1.75},
    ]
    assert run.axes["eval/ppl/yarn"] == "eval/length"
    assert run.axes["eval/loss_by_position/L16"] == "eval/position"
    assert list(figure) == ["eval/ppl_vs_length"]  # a wandb.Image


def test_the_headline_metrics_go_to_the_wandb_summary_and_the_config_to_its_config(
    fake_wandb, tmp_path
):
    cfg = compose_config([*TINY, "logger=wandb"])
    with open_logger(cfg, tmp_path) as logger:
        logger.log_summary({"final_loss": 1.5, "ppl_at_16": 4.0})
    (run,) = fake_wandb.runs
    assert run.summary == {"final_loss": 1.5, "ppl_at_16": 4.0}
    assert run.init["config"]["train.seq_len"] == 16
    assert run.init["config"]["encoding.name"] == "rope"


def test_a_wandb_run_is_named_after_its_run_directory_and_lives_in_it(fake_wandb, tmp_path):
    wandb_run(tmp_path / "08-06-17_rope", overrides=["logger.project=mine", "logger.mode=offline"])
    (run,) = fake_wandb.runs
    assert run.init["name"] == "08-06-17_rope"
    assert run.init["dir"] == str(tmp_path / "08-06-17_rope")
    assert (run.init["project"], run.init["mode"], run.init["group"]) == ("mine", "offline", None)


def test_logger_mode_null_leaves_the_mode_to_wandb_mode(fake_wandb, tmp_path):
    wandb_run(tmp_path)
    assert fake_wandb.runs[0].init["mode"] is None  # wandb.init then reads WANDB_MODE


def test_the_jobs_of_a_sweep_share_the_group_named_by_its_directory(
    fake_wandb, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    sweep = tmp_path / "outputs" / "multirun" / "2026-12-06" / "08-06-17"
    sweep.mkdir(parents=True)
    (sweep / SWEEP_MARKER).write_text("{}")
    wandb_run(sweep / "0_rope_seed0")
    wandb_run(sweep / "1_alibi_seed0")
    groups = {run.init["group"] for run in fake_wandb.runs}
    assert groups == {"outputs/multirun/2026-12-06/08-06-17"}


def test_a_resumed_run_continues_its_wandb_run(fake_wandb, tmp_path):
    wandb_run(tmp_path)
    wandb_run(tmp_path)
    first, resumed = fake_wandb.runs
    assert json.loads((tmp_path / RUN_FILE).read_text()) == {"id": "fresh-id", "group": None}
    assert (resumed.init["id"], resumed.init["resume"]) == (first.id, "allow")


def test_a_reevaluation_is_a_new_wandb_run_in_the_group_of_the_training(
    fake_wandb, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / SWEEP_MARKER).write_text("{}")
    wandb_run(tmp_path / "sweep" / "0_rope_seed0")
    monkeypatch.chdir(tmp_path / "sweep")  # the group is the training's, wherever eval runs
    wandb_run(tmp_path / "sweep" / "0_rope_seed0", job_type="eval")
    trained, evaluated = fake_wandb.runs
    assert evaluated.init["id"] is None
    assert evaluated.init["group"] == trained.init["group"] == "sweep"
    assert (evaluated.init["name"], evaluated.init["job_type"]) == ("0_rope_seed0-eval", "eval")


def test_a_run_that_raises_finishes_its_wandb_run_as_failed(fake_wandb, tmp_path):
    cfg = compose_config([*TINY, "logger=wandb"])
    with pytest.raises(KeyboardInterrupt), open_logger(cfg, tmp_path):
        raise KeyboardInterrupt
    assert fake_wandb.runs[0].exit_code == 1


def test_only_rank_zero_logs(tmp_path, monkeypatch):
    monkeypatch.setattr(loggers.distributed, "is_main", lambda: False)
    with open_logger(compose_config(TINY), tmp_path) as logger:
        assert isinstance(logger, NoLogger)
        logger.log_scalars({"train/loss": 1.0}, step=1)
    assert not any(tmp_path.iterdir())


def test_a_resumed_run_may_change_its_logger():
    before, after = compose_config(["logger=tensorboard"]), compose_config(["logger=wandb"])
    assert changed_keys(before, after) == []


def test_logger_wandb_without_the_package_is_one_line_before_anything_runs(
    capsys, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    line = error_line(capsys, "train", "logger=wandb")
    assert line == 'logger=wandb needs the wandb package: pip install -e ".[wandb]"'
    assert not (tmp_path / "outputs").exists()


def test_reevaluating_a_wandb_run_without_the_package_is_one_line_before_evaluating(
    fake_wandb, tiny, capsys, tmp_path, monkeypatch
):
    train(compose_config([*tiny, "logger=wandb", "train.steps=5", "eval.lengths=[16]"]), tmp_path)
    before = (tmp_path / "results.json").read_text()
    monkeypatch.setitem(sys.modules, "wandb", None)
    line = error_line(capsys, "eval", "--run", str(tmp_path), "--length", "64")
    assert line == 'logger=wandb needs the wandb package: pip install -e ".[wandb]"'
    assert (tmp_path / "results.json").read_text() == before


def test_logger_none_writes_no_events(tiny, tmp_path):
    train(compose_config([*tiny, "logger=none", "train.steps=5", "eval.lengths=[16]"]), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint.pt",
        "config.yaml",
        "model.safetensors",
        "results.json",
    ]


# --------------------------------------------------------------------------- W&B offline


def records_of(path: Path) -> list:
    """The whole records of a ``.wandb`` file so far: LevelDB's log format (32 KiB blocks of
    chunks, each with a 7-byte header: CRC, length, type) after a 7-byte file header, each
    record a protobuf. A chunk not yet written in full ends the reading."""
    from wandb.proto.wandb_internal_pb2 import Record

    block = 32 * 1024
    data, records, at, pending = path.read_bytes(), [], 7, b""
    while at + 7 <= len(data):
        if block - at % block < 7:  # a block's tail too short for a header is padding
            at += block - at % block
            continue
        _, length, kind = struct.unpack("<IHB", data[at : at + 7])
        if kind == 0 or at + 7 + length > len(data):  # preallocated zeros, or still writing
            break
        pending += data[at + 7 : at + 7 + length]
        at += 7 + length
        if kind in (1, 4):  # a whole record, or its last chunk
            records.append(Record.FromString(pending))
            pending = b""
    return records


def finished_records(path: Path, seconds: float = 30.0) -> list:
    """The records of a ``.wandb`` file once its run's exit record is in it: W&B's service
    process may still be writing it when the run's process has returned (seen on a loaded
    machine)."""
    deadline = time.monotonic() + seconds
    while True:
        records = records_of(path)
        if of_type(records, "exit") or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def run_record(records: list):
    (run,) = of_type(records, "run")
    return run


def wandb_records(run_dir: Path, job_type: str = "train") -> list:
    """The records of the offline W&B run of ``job_type`` under ``run_dir``."""
    for path in run_dir.glob("wandb/offline-run-*/run-*.wandb"):
        records = finished_records(path)
        if run_record(records).job_type == job_type:
            return records
    raise AssertionError(f"no offline W&B {job_type} run under {run_dir}")


def values(items) -> dict:
    """A history row's, summary update's or config update's items as a dict."""
    return {"/".join(item.nested_key) or item.key: json.loads(item.value_json) for item in items}


def of_type(records: list, kind: str) -> list:
    return [getattr(r, kind) for r in records if r.WhichOneof("record_type") == kind]


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    for variable in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(variable, str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def test_an_offline_wandb_run_holds_the_training_loss_and_the_results_evaluation(
    offline_wandb, tiny, tmp_path
):
    run_dir = tmp_path / "run"
    overrides = [*tiny, "logger=wandb", "train.steps=10", "eval.lengths=[16,32]"]
    results = train(compose_config(overrides), run_dir)
    records = wandb_records(run_dir)
    rows = [values(row.item) for row in of_type(records, "history")]
    losses = {row["train/step"]: row["train/loss"] for row in rows if "train/loss" in row}
    assert sorted(losses) == [5, 10]
    ppl = {row["eval/length"]: row["eval/ppl"] for row in rows if "eval/ppl" in row}
    assert ppl == {r["length"]: r["ppl"] for r in results["eval"]}
    config = values(run_record(records).config.update)
    assert config["logger.name"] == "wandb" and config["train.steps"] == 10
    summary = {k: v for s in of_type(records, "summary") for k, v in values(s.update).items()}
    assert summary["final_loss"] == results["train"]["final_loss"]
    assert not list(run_dir.glob("events.out.tfevents*"))


@pytest.mark.slow
def test_a_sweeps_jobs_are_one_wandb_group(offline_wandb, tiny, tmp_path):
    posbench(
        "train",
        "-m",
        "seed=0,1",
        *tiny,
        "logger=wandb",
        "train.steps=2",
        "eval.lengths=[16]",
        "hydra.sweep.dir=sweep",
        cwd=tmp_path,
    )
    jobs = sorted((tmp_path / "sweep").glob("*_seed*"))
    assert len(jobs) == 2
    assert {run_record(wandb_records(job)).run_group for job in jobs} == {"sweep"}


def reevaluated(run_dir: Path, capsys) -> None:
    """``posbench eval --length 64 --run run_dir``, in this process."""
    from posbench.cli import main

    main(["eval", "--length", "64", "--run", str(run_dir)])
    capsys.readouterr()


def test_posbench_eval_of_a_wandb_run_logs_every_record_to_an_eval_run_of_its_own(
    offline_wandb, tiny, tmp_path, capsys
):
    run_dir = tmp_path / "run"
    train(compose_config([*tiny, "logger=wandb", "train.steps=5", "eval.lengths=[16]"]), run_dir)
    reevaluated(run_dir, capsys)
    records = wandb_records(run_dir, job_type="eval")
    assert run_record(records).display_name == "run-eval"
    rows = [values(row.item) for row in of_type(records, "history")]
    assert [row["eval/length"] for row in rows if "eval/ppl" in row] == [16, 64]


def test_posbench_eval_of_a_tensorboard_run_rewrites_its_eval_and_hparams_events_only(
    tiny, tmp_path, capsys
):
    """The evaluation's file of its own, and the HParams columns its metrics update; the
    training's scalars as they were, and no file added."""
    train(compose_config([*tiny, "train.steps=5", "eval.lengths=[16]"]), tmp_path)
    before = {path: path.read_bytes() for path in tmp_path.glob("events.out.tfevents*")}
    reevaluated(tmp_path, capsys)
    after = {path: path.read_bytes() for path in tmp_path.glob("events.out.tfevents*")}
    assert sorted(after) == sorted(before)  # no event file added
    changed = {path.name for path in before if after[path] != before[path]}
    assert changed == {EVAL_EVENTS_FILE, HPARAMS_EVENTS_FILE}
