"""``logger=wandb``: one Weights & Biases run per posbench run (``pip install -e ".[wandb]"``).

The W&B run is named after the run directory, holds the resolved config (flat: ``train.lr``,
``encoding.base``, ...) and lives in the run directory (``<run>/wandb/``). A sweep's jobs share
one W&B group, the sweep directory's path, so the workspace shows a sweep as one group (then
group its runs by ``encoding.name``, ``seed``, ...). ``logger.mode`` null leaves the mode to
``WANDB_MODE`` (online without it): ``offline`` writes the run locally for ``wandb sync``.

The W&B run's id and group are kept in ``<run>/wandb_run.json``: a resumed run continues its
W&B run (W&B keeps what a stopped run logged past its checkpoint: unlike TensorBoard's, its
history cannot be purged). ``posbench eval`` logs to a new W&B run of the same group, named
``<run>-eval`` (job type ``eval``), with the curves of all of results.json's records: a
re-evaluated length then has one point, as in TensorBoard's rewritten evaluation file, where
the training run's history could only add a second one.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import PIL.Image
from omegaconf import DictConfig

from posbench.config import choice, flat_config
from posbench.runs.directory import sweep_of
from posbench.runs.tensorboard_log import (
    TrainedLengths,
    effective_length_scalars,
    eval_figure,
    length_points,
    loss_by_position_points,
)
from posbench.system.atomic import write_json

if TYPE_CHECKING:
    from matplotlib.figure import Figure

RUN_FILE = "wandb_run.json"
# The x of each chart, logged beside its values. W&B's own step (wandb.log(step=...)) must
# only grow over a run, while an evaluation curve's x is a length: so every metric is drawn
# against the metric define_metric names as its step_metric, W&B's way to give a chart its own
# x-axis. The curves are then W&B's native line charts, which overlay the runs of a group and
# average them, as a sweep's comparison needs (a wandb.Table's custom chart would not).
TRAIN_STEP = "train/step"
EVAL_LENGTH = "eval/length"
EVAL_POSITION = "eval/position"  # loss by position: the bucket's end


class WandbLogger:
    """Training's scalars against ``train/step``; the evaluation curves against ``eval/length``
    (loss by position against ``eval/position``) and their figure as a ``wandb.Image``; the
    headline metrics in the run's summary."""

    def __init__(
        self, cfg: DictConfig, run_dir: Path, job_type: str, purge_step: int | None
    ) -> None:
        import wandb  # optional: config.check_logger refuses logger=wandb without it

        self.wandb = wandb
        saved = run_dir / RUN_FILE
        identity = json.loads(saved.read_text()) if saved.is_file() else None
        group = identity["group"] if identity else sweep_group(run_dir)
        resumed = identity is not None and job_type == "train"
        mode = cfg.logger.mode
        self.run = wandb.init(
            project=cfg.logger.project,
            entity=cfg.logger.entity,
            mode=None if mode is None else choice(mode),
            group=group,
            job_type=job_type,
            name=run_dir.name if job_type == "train" else f"{run_dir.name}-{job_type}",
            config=flat_config(cfg),
            dir=str(run_dir),
            id=identity["id"] if resumed else None,
            resume="allow" if resumed else None,
        )
        if job_type == "train" and identity is None:
            write_json(saved, {"id": self.run.id, "group": group})
        self.defined: set[str] = set()  # the metrics whose x-axis W&B knows

    def log_row(self, axis: str, x: int, values: Mapping[str, Any]) -> None:
        """One row of W&B's history: ``values`` at ``axis`` = ``x``."""
        for tag in values:
            if tag not in self.defined:
                self.run.define_metric(tag, step_metric=axis)
                self.defined.add(tag)
        self.run.log({axis: x, **values})

    def log_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        self.log_row(TRAIN_STEP, step, scalars)

    def log_evaluation(self, records: Sequence[Mapping[str, Any]], trained: TrainedLengths) -> None:
        rows: dict[tuple[str, int], dict[str, float]] = {}
        for axis, points in (
            (EVAL_LENGTH, length_points(records)),
            (EVAL_POSITION, loss_by_position_points(records)),
        ):
            for point in points:
                rows.setdefault((axis, point.x), {})[point.tag] = point.value
        # In order of x, so that each curve is drawn from left to right.
        for (axis, x), values in sorted(rows.items()):
            self.log_row(axis, x, values)
        self.run.summary.update(effective_length_scalars(records, trained))
        figure = eval_figure(records, trained)
        if figure is not None:
            tag, image = figure
            self.run.log({tag: self.wandb.Image(png(image))})

    def log_summary(self, metrics: Mapping[str, float]) -> None:
        self.run.summary.update(dict(metrics))

    def flush(self) -> None:
        pass  # wandb hands every row to its own process at once

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


def png(figure: Figure) -> PIL.Image.Image:
    """``figure`` drawn as a PNG image. wandb.Image would draw a matplotlib figure itself, but
    only once matplotlib.pyplot is imported, which posbench never needs."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return PIL.Image.open(buffer)


def sweep_group(run_dir: Path) -> str | None:
    """A sweep job's W&B group: its sweep directory's path (``outputs/multirun/<date>/<time>``,
    below the working directory; else absolute), so no two sweeps share one; None for a run
    of its own."""
    sweep = sweep_of(run_dir)
    if sweep is None:
        return None
    sweep, here = sweep.resolve(), Path.cwd().resolve()
    return str(sweep.relative_to(here) if sweep.is_relative_to(here) else sweep)
