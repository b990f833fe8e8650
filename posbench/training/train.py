"""``train(cfg, run_dir)``: train at ``train.seq_len``, then evaluate at every ``eval.lengths``.

A plain function that returns the results it also writes to ``run_dir``; the Hydra entry point
in posbench/commands/train.py is a thin wrapper around it. ``train`` builds the run's parts
once (data, model, optimizer, batch sampler, checkpointer, run logger, precision),
``train_steps`` (train_loop.py) runs the optimisation loop over those objects, and
``evaluate_and_record`` writes the run.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from posbench.config import (
    choice,
    eval_lengths,
    position_sampler,
    resolve_device,
    validate,
    with_steps_share,
)
from posbench.data import Corpus, Task, load_data
from posbench.evaluation.positions import eval_positions, eval_remap
from posbench.evaluation.run import evaluate_data
from posbench.evaluation.temperature import check_temperature
from posbench.model import Transformer, build_model
from posbench.runs.directory import prepare_run_dir, save_config, save_tokenizer, save_weights
from posbench.runs.loggers import RunLogger, open_logger
from posbench.runs.results import (
    diverged_results,
    read_results,
    run_description,
    with_effective_context_length,
    with_length_generalization,
    write_results,
)
from posbench.runs.tensorboard_log import headline_metrics, trained_lengths
from posbench.system import distributed
from posbench.system.precision import resolve_precision
from posbench.system.threads import (
    ThreadController,
    Threads,
    registered_threads,
    use_threads,
    warn_if_oversubscribed,
)
from posbench.training.checkpoint import Checkpointer, TrainProgress, restore_checkpoint
from posbench.training.finetune import fine_tune_config, load_parent_weights
from posbench.training.resume import already_finished, check_resume_precision, checkpoint_to_resume
from posbench.training.train_loop import Diverged, LoopSettings, train_steps

log = logging.getLogger(__name__)


def train(cfg: DictConfig, run_dir: str | Path, command: str | None = None) -> dict[str, Any]:
    """Train the configured model, evaluate it at every eval length, and write the run
    (``command``: what started it, for results.json's ``ran``).

    With ``train.resume`` it continues from ``run_dir``'s checkpoint when there is one
    (resume.py). Returns the content of ``run_dir/results.json``; raises
    Diverged (after recording ``"status": "diverged"``) or TrainingInterrupted.
    """
    # Under torchrun or SLURM: join the other ranks (posbench/system/distributed.py)
    distributed.setup()
    # Every rank is past Hydra's start in the run directory, which rank 0 alone removes if the
    # run fails before writing anything (commands.train.remove_if_worthless).
    distributed.wait_for_all()
    validate(cfg)
    check_temperature(cfg.eval.temperature, cfg, eval_lengths(cfg))
    eval_remap(cfg)  # refused before training, not after it
    threads = use_threads(cfg.threads)  # before any work; the run's first log line
    warn_if_oversubscribed(threads)
    with registered_threads(threads) as controller:  # other posbench jobs count its threads
        return train_with_threads(cfg, run_dir, threads, controller, command)


def train_with_threads(
    cfg: DictConfig,
    run_dir: str | Path,
    threads: Threads,
    controller: ThreadController | None,
    command: str | None = None,
) -> dict[str, Any]:
    """``train`` once its threads are set: ``controller`` adapts an ``auto`` count (None: a
    count the user set)."""
    cfg = fine_tune_config(with_steps_share(cfg))
    run_dir = Path(run_dir)
    # Rank 0 goes first where it creates what the other ranks read (the directory, the data
    # cache), so that a mistake there is reported once (distributed.rank_zero_first).
    checkpoint = distributed.rank_zero_first(lambda: checkpoint_to_resume(cfg, prepared(run_dir)))
    if checkpoint is not None and already_finished(checkpoint, cfg.train.steps, run_dir):
        log.info(
            "%s finished at step %d: nothing to resume; `posbench train --resume %s train.steps=N`"
            " extends it, `posbench eval --run %s` re-evaluates it",
            run_dir,
            cfg.train.steps,
            run_dir,
            run_dir,
        )
        return read_results(run_dir)

    # The parts, each built once from its own config section.
    device = distributed.local_device(resolve_device(cfg.device))
    data = distributed.rank_zero_first(lambda: load_data(cfg.data))
    model = initial_model(cfg, data.vocab_size, resuming=checkpoint is not None).to(device)
    precision = distributed.from_rank_zero(  # all ranks must compute alike
        lambda: resolve_precision(choice(cfg.train.precision), device, cfg.model.d_model)
    )
    optimizer = make_optimizer(model, cfg.train)
    sampler = torch.Generator().manual_seed(cfg.seed)  # batch order depends on the seed only
    progress = TrainProgress()
    if checkpoint is not None:
        check_resume_precision(checkpoint, precision, run_dir)
        progress = restore_checkpoint(checkpoint, model, optimizer, sampler)
    checkpointer = Checkpointer(
        run_dir, cfg.train.checkpoint_every, cfg.train.steps, precision, progress.step
    )
    settings = LoopSettings(
        cfg.train,
        precision,
        cfg.seed,
        position_sampler(cfg),
        eval_positions(cfg),
        cfg.encoding.name,
    )
    if controller is not None and (cfg.train.compile or device.type == "cuda"):
        # torch.compile's kernels (the model's, or flex_attention's on a GPU) are specialized to
        # torch's thread count: each new count compiles them again, and past dynamo's recompile
        # limit the model would run uncompiled. A GPU's steps hardly use the CPU's threads.
        log.info(
            "threads=auto: %d thread(s) kept while training (compiled kernels)", threads.threads
        )
        controller = None

    if distributed.is_main():
        save_config(run_dir, cfg)
        save_tokenizer(run_dir, data)
    log.info(
        "%s: %s parameters, %s, device %s, precision %s, %d rank(s)",
        cfg.encoding.name,
        f"{model.num_parameters():,}",
        data.describe(),
        device,
        precision,
        distributed.world_size(),
    )
    results = run_description(cfg, model, data, precision, threads.threads, command)
    # Events past the checkpoint (written before a crash) are dropped, so no step repeats; a
    # resumed run without a checkpoint starts again at step 1, past anything logged before.
    purge_step = progress.step + 1 if cfg.train.resume else None
    with open_logger(cfg, run_dir, purge_step=purge_step) as logger:
        try:
            summary = train_steps(
                model,
                data,
                optimizer,
                sampler,
                progress,
                checkpointer,
                logger,
                settings,
                controller,
            )
        except Diverged as err:
            if distributed.is_main():
                steps, last = cfg.train.steps, err.last_finite_loss
                write_results(run_dir, diverged_results(results, steps, err.step, last))
            raise
        # Rank 0 evaluates and writes the run; the other ranks wait for its results.
        results = {**results, "train": summary}
        return distributed.from_rank_zero(
            lambda: evaluate_and_record(model, data, cfg, run_dir, logger, results)
        )


def prepared(run_dir: Path) -> Path:
    """``run_dir``, created and checked by rank 0 (``prepare_run_dir``), which alone writes it."""
    return prepare_run_dir(run_dir) if distributed.is_main() else run_dir


def initial_model(cfg: DictConfig, vocab_size: int, resuming: bool) -> Transformer:
    """The model over ``vocab_size`` tokens (its data's) before its first step: initialised
    from the seed, and for a fine-tune (``train.init_from``) given its parent's weights, unless
    ``resuming`` restores its own."""
    torch.manual_seed(cfg.seed)  # model init (and dropout) depend on the seed alone
    model = build_model(cfg.model, cfg.encoding, vocab_size)
    if cfg.train.init_from is not None and not resuming:
        load_parent_weights(model, cfg)
    return model


def evaluate_and_record(
    model: Transformer,
    data: Corpus | Task,
    cfg: DictConfig,
    run_dir: Path,
    logger: RunLogger,
    results: dict[str, Any],
) -> dict[str, Any]:
    """Save the weights, evaluate them at every eval length, and write ``results`` with the
    evaluation records to results.json and the run's logger; returns what it wrote."""
    save_weights(run_dir, model)
    records = evaluate_data(
        model,
        data,
        eval_lengths(cfg),
        cfg.eval.stride,
        cfg.eval.batch_size,
        cfg.eval.max_tokens,
        cfg.train.seq_len,
        choice(cfg.eval.precision),
        eval_positions(cfg),
        choice(cfg.eval.decode),
        temperature=cfg.eval.temperature,
        remap=eval_remap(cfg),
        compiled=cfg.eval.compile,
    )
    results = {**results, "eval": records}
    trained = trained_lengths(cfg)
    if trained.problem_lengths:
        results = with_length_generalization(results, trained.hi)
    else:
        results = with_effective_context_length(results)
    write_results(run_dir, results)
    logger.log_evaluation(records, trained)
    logger.log_summary(headline_metrics(results))
    return results


def fused_adamw(devices: Iterable[torch.device]) -> bool:
    """Whether AdamW runs fused (one kernel updates every parameter, instead of a few launches
    per parameter): exactly when every parameter is on a CUDA device ``devices``. On a CPU the
    fused kernel measured within noise of the default one (docs/scaling.md, "Precision and
    compile")."""
    return all(device.type == "cuda" for device in devices)


def make_optimizer(model: Transformer, cfg: DictConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only: decaying norms, biases, embedding tables and
    the positional encoding's own parameters (a position table, KERPLE's kernel, FIRE's MLP)
    only pulls them toward zero without regularising much. Fused on CUDA (fused_adamw)."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    encodings = model.layer_encodings
    exempt = embeddings | {id(p) for encoding in encodings for p in encoding.parameters()}
    decay, no_decay = [], []
    for param in model.parameters():
        (decay if param.dim() >= 2 and id(param) not in exempt else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    fused = fused_adamw(param.device for param in model.parameters())
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused)
