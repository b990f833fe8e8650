"""The optimisation loop over the parts ``train`` built (train.py): ``train_steps``
runs from a fresh start or a checkpoint to the last step, one ``train_step`` at a time (the
global batch, its randomized positions, its rows cut to the width their answers reach, the
learning rate), validating, logging and checkpointing as it goes; it ends early with Diverged
(a non-finite loss) or TrainingInterrupted (a stop signal).
"""

from __future__ import annotations

import logging
import math
import signal
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig
from tqdm.auto import tqdm

from posbench.data import IGNORE, Corpus, Task
from posbench.errors import PosbenchError
from posbench.evaluation.perplexity import perplexity
from posbench.evaluation.positions import RandomPositions
from posbench.model import Transformer
from posbench.model.random_positions import PositionDraw, PositionSampler, row_lengths
from posbench.runs.loggers import RunLogger
from posbench.system import distributed
from posbench.system.precision import autocast, compile_for_training
from posbench.system.signals import stop_requests
from posbench.system.threads import ThreadController
from posbench.training.checkpoint import Checkpointer, TrainProgress

log = logging.getLogger(__name__)


class Diverged(PosbenchError):
    """The training loss became NaN or infinite; the last good checkpoint is kept."""

    def __init__(self, message: str, step: int, last_finite_loss: float | None) -> None:
        super().__init__(message)
        self.step = step
        self.last_finite_loss = last_finite_loss


class TrainingInterrupted(Exception):
    """SIGINT or SIGTERM stopped training after a checkpoint; ``posbench train --resume``
    continues it."""

    def __init__(self, signum: int, step: int, run_dir: Path) -> None:
        name = signal.Signals(signum).name
        super().__init__(f"{name} at step {step}; checkpoint saved in {run_dir}")
        self.signum, self.step, self.run_dir = signum, step, run_dir

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM


@dataclass(frozen=True)
class LoopSettings:
    """What the loop reads besides its parts, taken from the config once by ``train``."""

    train: DictConfig  # the train section: steps, batches, intervals and train_step's settings
    precision: str  # resolved (fp32 or bf16): the steps and validation run in it
    seed: int  # with the step and the rank, it seeds dropout (seed_dropout)
    positions: PositionSampler | None  # train.random_positions's draws (None: 0..T-1)
    val_positions: RandomPositions | None  # validation scores where evaluation does
    name: str  # the encoding's, on the progress bar


def train_steps(
    model: Transformer,
    data: Corpus | Task,
    optimizer: torch.optim.Optimizer,
    sampler: torch.Generator,
    progress: TrainProgress,
    checkpointer: Checkpointer,
    logger: RunLogger,
    settings: LoopSettings,
    threads: ThreadController | None = None,
) -> dict[str, Any]:
    """The optimisation loop, from ``progress`` (a fresh start's, or a checkpoint's) to the last
    step; returns the training summary (results.json's ``train``), with the thread count's
    changes made by ``threads`` (an ``auto`` count's controller), those before a resume
    included.

    Checkpoints when ``checkpointer`` says it is due, and at the step where the ranks agree on
    a stop signal (then raises TrainingInterrupted, once rank 0's checkpoint is on disk);
    raises Diverged on a non-finite loss.
    """
    tcfg, precision = settings.train, settings.precision
    model.train()
    device = next(model.parameters()).device
    stepper: torch.nn.Module = model
    if tcfg.compile and progress.step < tcfg.steps:
        _, micro_batch = distributed.rows_of_rank(tcfg.batch_size, tcfg.grad_accum)
        batch = torch.zeros(micro_batch, tcfg.seq_len, dtype=torch.long, device=device)
        task = isinstance(data, Task)  # its batches run in slices of many shapes
        stepper, seconds = compile_for_training(model, batch, precision, varying_shape=task)
        progress.compile_time += seconds
        log.info("torch.compile: %.1f s (not counted in tokens/s)", seconds)
    stepper = distributed.data_parallel(stepper, device)
    # Rank 0's bar only. On rank 0 disable is not passed at all: tqdm takes the defaults of the
    # arguments not given from TQDM_* variables (TQDM_DISABLE=1), and an explicit False wins.
    others_hidden = {} if distributed.is_main() else {"disable": True}
    bar = tqdm(
        range(progress.step, tcfg.steps),
        initial=progress.step,
        total=tcfg.steps,
        desc=f"train {settings.name}",
        unit="step",
        **others_hidden,
    )
    stopping = None  # the stop signal every rank agreed on
    with stop_requests() as stop:
        for step in bar:
            started = time.perf_counter()
            seed_dropout(settings.seed, step)
            share, positions = train_step(
                stepper, optimizer, data, sampler, step, tcfg, precision, settings.positions
            )
            # The global batch's mean loss, and whether any rank was asked to stop: every rank
            # decides alike, so none waits at a step the others never take. A signal arriving
            # after this agreement (during validation or the checkpoint) counts at the next step.
            loss_value = distributed.sum_over_ranks(share)
            stopping = distributed.agree_on_stop(stop.signum)
            if not math.isfinite(loss_value):
                raise divergence(step + 1, loss_value, progress, checkpointer, tcfg)
            seconds = time.perf_counter() - started
            progress.train_time += seconds
            progress.tokens_seen += positions
            progress.step = step + 1
            if threads is not None:
                known = len(threads.changes)
                threads.after_step(progress.step, seconds)
                progress.thread_changes += map(asdict, threads.changes[known:])
            # The window final_loss averages: the last log_every losses.
            progress.recent_losses = [*progress.recent_losses, loss_value][-tcfg.log_every :]
            if progress.step % tcfg.log_every == 0 or progress.step == tcfg.steps:
                log_training(logger, bar, progress, loss_value, lr_at(step, tcfg))
            if progress.step % tcfg.val_every == 0 or progress.step == tcfg.steps:
                progress.val_loss = validation_loss(
                    model, data, tcfg, precision, settings.val_positions
                )
                val_ppl = perplexity(progress.val_loss)
                validation = {"val/loss": progress.val_loss, "val/ppl": val_ppl}
                logger.log_scalars(validation, progress.step)
            if checkpointer.due(progress.step) or stopping is not None:
                logger.flush()  # the logged curves reach at least as far as the checkpoint
                checkpointer.save(model, optimizer, sampler, progress)
            if stopping is not None:
                break
        # A signal during the last step's validation or checkpoint: that step is saved, and
        # every rank stops before the evaluation.
        stopping = stopping or distributed.agree_on_stop(stop.signum)
    bar.close()
    if stopping is not None:
        raise TrainingInterrupted(stopping, progress.step, checkpointer.run_dir)
    return train_summary(progress)


def train_summary(progress: TrainProgress) -> dict[str, Any]:
    """results.json's ``train`` of a run trained to its last step: the mean loss of the last
    ``train.log_every`` steps, the last validation's perplexity, and the time it took
    (torch.compile's apart, not counted in tokens/s)."""
    return {
        "steps": progress.step,
        "final_loss": sum(progress.recent_losses) / len(progress.recent_losses),
        "val_ppl": perplexity(progress.val_loss),
        "tokens_per_s": progress.tokens_seen / progress.train_time,
        "wall_s": progress.train_time,
        "compile_s": progress.compile_time,
        "thread_changes": progress.thread_changes,
    }


def seed_dropout(seed: int, step: int) -> None:
    """Seed the global generators, which dropout draws from, for ``step`` on this rank: the
    ranks hold different rows of the batch and get different masks, and a resumed run draws
    the masks the uninterrupted one did without the generators' state in the checkpoint."""
    state = np.random.SeedSequence([seed, step, distributed.rank()]).generate_state(1, np.uint64)
    torch.manual_seed(int(state[0]))


def log_training(
    logger: RunLogger, bar: tqdm, progress: TrainProgress, loss: float, lr: float
) -> None:
    tokens_per_s = progress.tokens_seen / progress.train_time
    scalars = {"train/loss": loss, "train/lr": lr, "train/tokens_per_s": tokens_per_s}
    logger.log_scalars(scalars, progress.step)
    bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tokens_per_s:,.0f}")


def divergence(
    step: int,
    loss: float,
    progress: TrainProgress,
    checkpointer: Checkpointer,
    cfg: DictConfig,
) -> Diverged:
    last = progress.recent_losses[-1] if progress.recent_losses else None
    last_text = f"{last:.4g}" if last is not None else "none yet"
    saved = checkpointer.saved_step
    kept = f"the checkpoint of step {saved} is kept" if saved else "no checkpoint yet"
    return Diverged(
        f"training diverged at step {step} (loss {loss}, last finite loss {last_text}); "
        f"{kept} in {checkpointer.run_dir}; lower train.lr (now {cfg.lr:g}) or raise "
        "train.warmup_steps",
        step,
        last,
    )


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    data: Corpus | Task,
    sampler: torch.Generator,
    step: int,
    cfg: DictConfig,
    precision: str = "fp32",
    positions: PositionSampler | None = None,
) -> tuple[float, int]:
    """One optimisation step at ``lr_at(step)`` in ``precision`` on a global batch of
    ``train.batch_size`` drawn from ``sampler``, at randomized ``positions`` (those of
    ``train.random_positions``: ``position_sampler``; None: 0..T-1); returns this rank's share
    of the batch's mean loss (a task's: on its trained targets only), which summed over the
    ranks is that mean, and the input positions every rank's forward passes ran (the tokens
    tokens/s counts: batch_size x seq_len for a corpus). A task's rows run in slices cut to the
    width their answers reach (width_slices), with the gradient of the whole batch; its
    positions are the slices', padding included.
    ``model`` is the Transformer, its compiled wrapper (compile_for_training) or either
    wrapped for data parallelism (distributed.data_parallel)."""
    device = next(model.parameters()).device
    for group in optimizer.param_groups:
        group["lr"] = lr_at(step, cfg)
    # Every rank draws the whole global batch and keeps its own rows: the sampler's state stays
    # the same on all ranks (and in the checkpoint), and the batches depend on the seed alone,
    # not on how many ranks and micro-batches share them.
    x, y = data.train_batch(cfg.batch_size, cfg.seq_len, sampler, step)
    scored = int((y != IGNORE).sum())  # targets in the global batch: the loss is their mean
    rows, micro_batch = distributed.rows_of_rank(cfg.batch_size, cfg.grad_accum)
    consecutive = cfg.random_positions is None and cfg.get("positions") != "pose"
    assert (positions is None) == consecutive, "train.random_positions' or PoSE's draws"
    drawn = PositionDraw()  # every row at positions 0, 1, 2, ...
    if positions is not None:
        # Each row for its own length, drawn for the global batch like the batch itself, from
        # the sampler whose state the checkpoint already holds.
        drawn = positions.draw(row_lengths(y), x.shape[1], sampler)
    pieces = []  # (inputs, targets, PositionDraw) to run, each as wide as its rows need
    computed = 0  # input positions every rank runs
    # Every rank's micro-batches, for the positions they run; this rank keeps its own.
    for micro_rows in torch.arange(cfg.batch_size).split(micro_batch):
        for piece_rows, width in width_slices(y[micro_rows]):
            kept = micro_rows[piece_rows]
            computed += len(kept) * width
            if rows.start <= kept[0] < rows.stop:
                pieces.append((x[kept, :width], y[kept, :width], drawn.rows(kept, width)))
    # DDP averages the gradients over the ranks; scaled by their number, the sum over ranks and
    # micro-batches is the gradient of the global batch's mean loss.
    scale = distributed.world_size() / scored
    optimizer.zero_grad(set_to_none=True)
    loss_sum = 0.0
    for i, (xs, ys, ps) in enumerate(pieces):
        xs, ys, ps = xs.to(device), ys.to(device), ps.to(device)
        with distributed.sync_gradients(model, last=i == len(pieces) - 1):
            with autocast(precision, device):
                # summed over ys's scored targets, float32
                nll = model(xs, ps.positions, targets=ys, distances=ps.distances)
            (nll * scale).backward()
        loss_sum += nll.item()  # also waits for the device, so the caller's timing is honest
    if cfg.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    optimizer.step()
    return loss_sum / scored, computed


# Rows of a micro-batch run in up to this many slices of similar width. An algorithmic task's
# batch is as wide as its longest problem, and under causal attention the padding after a
# row's last answer byte changes none of its losses: cutting it takes a duplicate_string step
# 1.6-1.7x faster at one thread, 1.2-1.4x at two (benchmarks/README.md, "Algorithmic training
# steps"); eight slices cost more in calls than they saved.
WIDTH_SLICES = 4


def width_slices(targets: torch.Tensor) -> list[tuple[torch.Tensor, int]]:
    """``targets``'s (B, T) rows grouped for running apart: (row indices, width) pairs, the
    rows sorted by the width they need (up to their last scored target) and cut into at most
    WIDTH_SLICES groups, each run as wide as its widest row. Neighbouring groups of one width
    run as one (a corpus's rows, all scored to the end, run whole)."""
    needed = row_lengths(targets)  # (B,)
    order = needed.argsort(stable=True)
    slices: list[tuple[torch.Tensor, int]] = []
    for group in order.chunk(WIDTH_SLICES):
        width = int(needed[group].max())
        if slices and slices[-1][1] == width:
            slices[-1] = (torch.cat([slices[-1][0], group]), width)
        else:
            slices.append((group, width))
    return slices


def lr_at(step: int, cfg: DictConfig) -> float:
    """Linear warmup to ``lr`` over ``warmup_steps``, then cosine decay to ``min_lr``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * progress))


def validation_batches(
    data: Corpus | Task, cfg: DictConfig
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(inputs, targets) int64 (B, T), the same at every check, so validation curves are
    comparable across steps and runs: the leading non-overlapping windows of a corpus's
    validation split, or a task's evaluation examples at the training length (targets
    IGNORE outside the answers)."""
    if isinstance(data, Task):
        examples = data.validation_examples(cfg.seq_len)
        yield from zip(
            examples.inputs().split(cfg.batch_size),
            examples.targets().split(cfg.batch_size),
            strict=True,
        )
        return
    width = cfg.seq_len + 1
    n_windows = min(cfg.val_batches * cfg.batch_size, (len(data.val) - 1) // cfg.seq_len)
    # A copy of the bytes these windows cover, not of the split (a memory map of the cache).
    tokens = torch.from_numpy(np.array(data.val[: n_windows * cfg.seq_len + 1]))
    rows = tokens.unfold(0, width, cfg.seq_len)  # (N, T+1)
    for batch in rows.long().split(cfg.batch_size):
        yield batch[:, :-1], batch[:, 1:]


@torch.inference_mode()
def validation_loss(
    model: Transformer,
    data: Corpus | Task,
    cfg: DictConfig,
    precision: str = "fp32",
    positions: RandomPositions | None = None,
) -> float:
    """Mean NLL per scored target (every target of a corpus, a task's trained ones), in the
    training ``precision``, at the positions evaluation uses (``eval_positions``; None:
    0..T-1)."""
    model.eval()
    device = next(model.parameters()).device
    total, count = 0.0, 0
    # Windows keyed as evaluation keys them for RandomPositions: a corpus window by its start
    # in the split, a task example by its index.
    key_step, first = (cfg.seq_len if isinstance(data, Corpus) else 1), 0
    for inputs, targets in validation_batches(data, cfg):
        at = PositionDraw()
        if positions is not None:  # each row for its own length
            keys = range(first * key_step, (first + len(inputs)) * key_step, key_step)
            at = positions.of_windows(inputs.shape[1], keys, row_lengths(targets))
        inputs, targets, at = inputs.to(device), targets.to(device), at.to(device)
        first += len(inputs)
        with autocast(precision, device):
            # summed NLL, float32
            total += model(inputs, at.positions, targets=targets, distances=at.distances)
        count += (targets != IGNORE).sum().item()
    model.train()
    return float(total) / count
