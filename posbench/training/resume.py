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

from omegaconf import DictConfig, OmegaConf

from posbench.config import flat_config, with_steps_share
from posbench.errors import PosbenchError
from posbench.runs.directory import CHECKPOINT_FILE, CONFIG_FILE, saved_config
from posbench.runs.results import read_results
from posbench.training.checkpoint import load_checkpoint, trained_precision
from posbench.training.finetune import fine_tune_config

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
    "device",  # where it runs, as threads: device=auto may pick another one on another machine
    "train.steps",
    "train.checkpoint_every",
    "train.resume",
    "train.grad_accum",
    "train.precision",
    "eval.",
    "data.cache_dir",
    "logger.",  # where the metrics go, not what they are
)


def changed_keys(saved: DictConfig, cfg: DictConfig) -> list[tuple[str, Any, Any]]:
    """``(key, saved value, value)`` for each key both configs hold whose value differs, outside
    RESUMABLE_KEYS, sorted by key. A key only one of them holds was added to posbench or removed
    from it since the run was saved: not a change of the run."""
    before, after = flat_config(saved), flat_config(cfg)
    return [
        (key, before[key], after[key])
        for key in sorted(before.keys() & after.keys())
        if before[key] != after[key] and not key.startswith(RESUMABLE_KEYS)
    ]


def check_resumable(saved: DictConfig, cfg: DictConfig, run_dir: Path) -> None:
    """Refuse to resume a run saved with ``saved`` under a config that trains differently."""
    changed = changed_keys(saved, cfg)
    if changed:
        key, before, after = changed[0]
        may_change = ", ".join(k + "*" if k.endswith(".") else k for k in RESUMABLE_KEYS)
        raise PosbenchError(
            f"{run_dir} was trained with {key}={before}, not {after}; a resumed run keeps its "
            f"config (only {may_change} may change): drop that override or start a new run"
        )


def check_same_run(cfg: DictConfig, run_dir: Path) -> None:
    """Refuse to write the run ``cfg`` composes into ``run_dir`` when that holds another run:
    without ``train.resume`` any run (the two would mix), with it a run whose config differs
    beyond RESUMABLE_KEYS (``train.resume=true hydra.run.dir=DIR`` of a forgotten override
    would otherwise continue, or overwrite, DIR's run with another). ``--resume DIR`` reads
    DIR's own config, so only its command line's overrides can differ (check_resumable)."""
    if not cfg.train.resume:
        files = (CONFIG_FILE, CHECKPOINT_FILE)
        held = next((name for name in files if (run_dir / name).is_file()), None)
        if held is not None:
            raise PosbenchError(
                f"{run_dir} already holds a run ({held}); continue it with "
                f"`posbench train --resume {run_dir}` or choose another hydra.run.dir"
            )
        return
    if not (run_dir / CONFIG_FILE).is_file():
        return
    # Its config.yaml as written: saved_config would name the run's tokenizer.json instead.
    composed = fine_tune_config(with_steps_share(cfg))
    changed = changed_keys(OmegaConf.load(run_dir / CONFIG_FILE), composed)
    if changed:
        shown = ", ".join(f"{key} ({before}, not {after})" for key, before, after in changed[:3])
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        raise PosbenchError(
            f"{run_dir} holds another run: this config differs in {shown}{more}; resume that "
            f"run with its own config: `posbench train --resume {run_dir}`, or choose another "
            "hydra.run.dir"
        )


def finished(run_dir: Path) -> bool:
    """Trained and evaluated to the end (results.json says ok)."""
    return read_results(run_dir).get("status") == "ok"


def finished_run_error(run_dir: Path, checkpoint_state: str) -> PosbenchError:
    """Why a finished run whose checkpoint is gone or unreadable (``checkpoint_state``) cannot
    continue: training it from the start would overwrite it with a copy."""
    return PosbenchError(
        f"{run_dir} is a finished run whose {CHECKPOINT_FILE} {checkpoint_state}, so it cannot "
        f"be resumed or extended; `posbench eval --run {run_dir}` re-evaluates it, and a longer "
        "run is a new run in another hydra.run.dir"
    )


def check_can_continue(run_dir: Path) -> None:
    """Refuse to resume a finished run that has no checkpoint (before Hydra writes into it)."""
    if not (run_dir / CHECKPOINT_FILE).is_file() and finished(run_dir):
        raise finished_run_error(run_dir, "is missing")


def checkpoint_to_resume(cfg: DictConfig, run_dir: Path) -> dict[str, Any] | None:
    """The checkpoint to continue from, or None to train from the start.

    A fresh run refuses a directory that already holds a run (it would mix two runs). With
    ``train.resume`` and no checkpoint yet, training starts from the beginning, so a requeued
    job can pass ``train.resume=true`` every time; a finished run without a checkpoint is
    refused instead (finished_run_error).
    """
    path = run_dir / CHECKPOINT_FILE
    if not cfg.train.resume:
        check_same_run(cfg, run_dir)
        return None
    if (run_dir / CONFIG_FILE).is_file():
        check_resumable(saved_config(run_dir), cfg, run_dir)
    check_can_continue(run_dir)
    if not path.is_file():
        log.info("no %s in %s yet: training from the start", CHECKPOINT_FILE, run_dir)
        return None
    try:
        checkpoint = load_checkpoint(path)
    except PosbenchError:
        if not finished(run_dir):
            raise
        raise finished_run_error(run_dir, "cannot be loaded") from None
    done = checkpoint["progress"]["step"]
    if done > cfg.train.steps:
        raise PosbenchError(
            f"{path} is at step {done}, past train.steps={cfg.train.steps}; "
            f"resume with train.steps >= {done}"
        )
    log.info("resuming %s from the checkpoint of step %d (of %d)", run_dir, done, cfg.train.steps)
    return checkpoint


def already_finished(checkpoint: dict[str, Any], steps: int, run_dir: Path) -> bool:
    """Trained to the end (``steps``) and evaluated: resuming has nothing left to do."""
    return checkpoint["progress"]["step"] == steps and finished(run_dir)


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
