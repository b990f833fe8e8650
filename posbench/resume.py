"""Resuming a run (``train.resume``, ``posbench train --resume DIR``): which checkpoint to
continue from, whether anything is left to do, and what a resumed run may change.

A resumed run must continue the run it resumes, not start another in its directory: its config
may differ only in what leaves the trained weights alone (``RESUMABLE_KEYS``), and its steps run
in the precision the checkpoint's did.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from posbench.checkpoint import CHECKPOINT_FILE, load_checkpoint, trained_precision
from posbench.config import flat_config
from posbench.errors import PosbenchError
from posbench.runs import read_results, saved_config

log = logging.getLogger(__name__)

# What a resumed run may change: none of it alters the trained weights (train.steps moves the
# end of the LR schedule, so extending a run is allowed but is not a run of that length; the
# thread count and train.grad_accum change only rounding, as does resuming with another number
# of ranks: every rank draws the same global batches). train.precision may change only to a
# setting that resolves to the precision the run was trained in (checked against the
# checkpoint by check_resume_precision). train.compile may not change: a compiled step runs
# other, generated kernels, so a run switched halfway would be one of neither kind, with
# whatever difference the compiler made hidden in it.
RESUMABLE_KEYS = (
    "threads",
    "train.steps",
    "train.checkpoint_every",
    "train.resume",
    "train.grad_accum",
    "train.precision",
    "eval.",
    "data.cache_dir",
)


def check_resumable(saved: DictConfig, cfg: DictConfig, run_dir: Path) -> None:
    """Refuse to resume a run saved with ``saved`` under a config that trains differently."""
    before, after = flat_config(saved), flat_config(cfg)
    for key in sorted(before.keys() | after.keys()):
        if before.get(key) != after.get(key) and not key.startswith(RESUMABLE_KEYS):
            may_change = ", ".join(k + "*" if k.endswith(".") else k for k in RESUMABLE_KEYS)
            raise PosbenchError(
                f"{run_dir} was trained with {key}={before.get(key)}, not {after.get(key)}; a "
                f"resumed run keeps its config (only {may_change} may change): drop that "
                "override or start a new run"
            )


def checkpoint_to_resume(cfg: DictConfig, run_dir: Path) -> dict[str, Any] | None:
    """The checkpoint to continue from, or None to train from the start.

    A fresh run refuses a directory that already holds a checkpoint (it would mix two runs).
    With ``train.resume`` and no checkpoint yet, training starts from the beginning, so a
    requeued job can pass ``train.resume=true`` every time.
    """
    path = run_dir / CHECKPOINT_FILE
    if not path.is_file():
        if cfg.train.resume:
            log.info("no %s in %s yet: training from the start", CHECKPOINT_FILE, run_dir)
        return None
    if not cfg.train.resume:
        raise PosbenchError(
            f"{run_dir} already holds a run ({CHECKPOINT_FILE}); continue it with "
            f"`posbench train --resume {run_dir}` or choose another hydra.run.dir"
        )
    check_resumable(saved_config(run_dir), cfg, run_dir)
    checkpoint = load_checkpoint(path)
    done = checkpoint["progress"]["step"]
    if done > cfg.train.steps:
        raise PosbenchError(
            f"{path} is at step {done}, past train.steps={cfg.train.steps}; "
            f"resume with train.steps >= {done}"
        )
    return checkpoint


def already_finished(checkpoint: dict[str, Any], steps: int, run_dir: Path) -> bool:
    """Trained to the end (``steps``) and evaluated: resuming has nothing left to do."""
    trained = checkpoint["progress"]["step"] == steps
    return trained and read_results(run_dir).get("status") == "ok"


def check_resume_precision(checkpoint: dict[str, Any], resolved: str, run_dir: Path) -> None:
    """A resumed run continues in the precision it was trained in: changing it changes the
    numbers, so the result would be a run of neither precision. (``train.precision`` itself may
    change, e.g. to spell out what ``auto`` chose on the first machine.)"""
    trained = trained_precision(checkpoint)
    if trained != resolved:
        raise PosbenchError(
            f"{run_dir} was trained in {trained}, but this run would continue in {resolved}; "
            f"resume with train.precision={trained}"
        )
