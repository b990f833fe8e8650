"""``logger=tensorboard``: event files in the run directory (posbench/runs/tensorboard_log.py says
what they hold)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from torch.utils.tensorboard import SummaryWriter

from posbench.runs.tensorboard_log import (
    TrainedLengths,
    hparams,
    log_hparams,
    write_eval_events,
    write_hparams_events,
)


class TensorBoardLogger:
    """Training's scalars and the HParams row in the run's SummaryWriter; the evaluation in an
    event file of its own, rewritten from all the records each time (write_eval_events), and
    with it the HParams tab's columns, every evaluated length's (write_hparams_events)."""

    def __init__(
        self, cfg: DictConfig, run_dir: Path, job_type: str, purge_step: int | None
    ) -> None:
        self.cfg, self.run_dir, self.purge_step = cfg, run_dir, purge_step

    @cached_property
    def writer(self) -> SummaryWriter:
        # Opened at its first use: each writer starts an event file, and `posbench eval`, which
        # only rewrites the evaluation's own file, would leave an empty one behind.
        return SummaryWriter(log_dir=str(self.run_dir), purge_step=self.purge_step)

    def log_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)

    def log_evaluation(self, records: Sequence[Mapping[str, Any]], trained: TrainedLengths) -> None:
        write_eval_events(self.run_dir, records, trained)
        write_hparams_events(self.run_dir, hparams(self.cfg), records, trained)

    def log_summary(self, metrics: Mapping[str, float]) -> None:
        log_hparams(self.writer, hparams(self.cfg), metrics)

    def flush(self) -> None:
        if "writer" in self.__dict__:
            self.writer.flush()

    def close(self, failed: bool = False) -> None:
        if "writer" in self.__dict__:
            self.writer.close()
