"""Where a run's metrics go: ``logger=tensorboard`` (the default), ``logger=wandb`` or
``logger=none``, each one RunLogger found by name in LOGGERS.

Training and ``posbench eval`` call only the RunLogger methods, never a logger by name: adding
a logger means one module here, one entry in LOGGERS, one YAML file in conf/logger/ and its
schema in posbench/config.py. What is logged (the tags, the evaluation curves and their
figure) is decided once, in posbench/runs/tensorboard_log.py, so every logger shows the same run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from omegaconf import DictConfig, OmegaConf

from posbench.runs.loggers.tensorboard import TensorBoardLogger
from posbench.runs.loggers.wandb import WandbLogger
from posbench.runs.tensorboard_log import TrainedLengths
from posbench.system import distributed


class RunLogger(Protocol):
    """What training and evaluation write, wherever it goes."""

    def log_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        """Training's numbers (``train/loss``, ``val/ppl``, ...) at training step ``step``."""

    def log_evaluation(self, records: Sequence[Mapping[str, Any]], trained: TrainedLengths) -> None:
        """The evaluation curves (x = length) and figure from ``records``, all the run's
        evaluation records (results.json's ``eval``)."""

    def log_summary(self, metrics: Mapping[str, float]) -> None:
        """The run's headline metrics (``tensorboard_log.headline_metrics``), beside its
        hyperparameters."""

    def flush(self) -> None:
        """Write what is buffered: a checkpoint is about to be saved."""

    def close(self, failed: bool = False) -> None:
        """The run's logging ends (``failed``: by an exception)."""


class NoLogger:
    """``logger=none``, and every rank but 0 (rank 0 logs the run's global numbers)."""

    def __init__(
        self, cfg: DictConfig, run_dir: Path, job_type: str, purge_step: int | None
    ) -> None:
        pass

    def log_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        pass

    def log_evaluation(self, records: Sequence[Mapping[str, Any]], trained: TrainedLengths) -> None:
        pass

    def log_summary(self, metrics: Mapping[str, float]) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self, failed: bool = False) -> None:
        pass


# Each is built as LOGGERS[name](cfg, run_dir, job_type, purge_step).
LOGGERS: dict[str, Callable[[DictConfig, Path, str, int | None], RunLogger]] = {
    "tensorboard": TensorBoardLogger,
    "wandb": WandbLogger,
    "none": NoLogger,
}


@contextmanager
def open_logger(
    cfg: DictConfig, run_dir: Path, job_type: str = "train", purge_step: int | None = None
) -> Iterator[RunLogger]:
    """The logger of ``cfg.logger.name`` for the run in ``run_dir`` on rank 0, NoLogger on the
    other ranks; closed on leaving the block. ``job_type``: ``train``, or ``eval`` for
    ``posbench eval``. ``purge_step``: a resumed run's first step, from which on what a stopped
    run logged past its checkpoint is dropped where the logger can (TensorBoard)."""
    # A run saved before the logger group existed logged to TensorBoard.
    name = OmegaConf.select(cfg, "logger.name", default="tensorboard")
    make = LOGGERS[name] if distributed.is_main() else NoLogger
    logger = make(cfg, run_dir, job_type, purge_step)
    try:
        yield logger
    except BaseException:
        logger.close(failed=True)
        raise
    logger.close()
