"""Where a run's metrics go (posbench/loggers/): logger=tensorboard (the default) or none."""

from pathlib import Path

from conftest import TINY

from posbench import loggers
from posbench.config import compose_config
from posbench.loggers import NoLogger, open_logger
from posbench.resume import changed_keys
from posbench.tensorboard_log import TrainedLengths
from posbench.train import train

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


def test_tensorboard_is_the_default_logger():
    assert compose_config().logger.name == "tensorboard"


def test_every_logger_takes_the_calls_training_and_eval_make(tmp_path):
    for name in loggers.LOGGERS:
        cfg = compose_config([*TINY, f"logger={name}"])
        with open_logger(cfg, tmp_path / name) as logger:
            logger.log_scalars({"train/loss": 1.0}, step=1)
            logger.flush()
            logger.log_evaluation([record(16, 2.0)], AT_16)
            logger.log_summary({"final_loss": 1.0})


def test_only_rank_zero_logs(tmp_path, monkeypatch):
    monkeypatch.setattr(loggers.distributed, "is_main", lambda: False)
    with open_logger(compose_config(TINY), tmp_path) as logger:
        assert isinstance(logger, NoLogger)
        logger.log_scalars({"train/loss": 1.0}, step=1)
    assert not any(tmp_path.iterdir())


def test_a_resumed_run_may_change_its_logger():
    before, after = compose_config(["logger=tensorboard"]), compose_config(["logger=none"])
    assert changed_keys(before, after) == []


def test_logger_none_writes_no_events(tiny, tmp_path):
    train(compose_config([*tiny, "logger=none", "train.steps=5", "eval.lengths=[16]"]), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint.pt",
        "config.yaml",
        "model.safetensors",
        "results.json",
    ]


def reevaluated(run_dir: Path, capsys) -> None:
    """``posbench eval --length 64 --run run_dir``, in this process."""
    from posbench.cli import main

    main(["eval", "--length", "64", "--run", str(run_dir)])
    capsys.readouterr()


def test_posbench_eval_of_a_tensorboard_run_rewrites_only_the_eval_events(tiny, tmp_path, capsys):
    train(compose_config([*tiny, "train.steps=5", "eval.lengths=[16]"]), tmp_path)
    before = sorted(tmp_path.glob("events.out.tfevents*"))
    reevaluated(tmp_path, capsys)
    assert sorted(tmp_path.glob("events.out.tfevents*")) == before
