"""``train(cfg, run_dir)``: train at ``train.seq_len``, then evaluate at every ``eval.lengths``.

A plain function that returns the results it also writes to ``run_dir``; the Hydra entry point
in posbench/cli.py is a thin wrapper around it.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch.utils.tensorboard import SummaryWriter
from tqdm.auto import tqdm

from posbench.config import eval_lengths, resolve_device, validate
from posbench.data import Corpus, load_corpus, sample_batch
from posbench.evaluate import evaluate
from posbench.model import Transformer, build_model
from posbench.runs import RESULTS_FILE, save_config, save_weights, write_json
from posbench.tensorboard_log import log_eval_records, log_hparams

log = logging.getLogger(__name__)


def make_optimizer(model: Transformer, cfg: DictConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only: decaying norms, biases and embedding
    tables (token or position) only pulls them toward zero without regularising much."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    decay, no_decay = [], []
    for param in model.parameters():
        (decay if param.dim() >= 2 and id(param) not in embeddings else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


def lr_at(step: int, cfg: DictConfig) -> float:
    """Linear warmup to ``lr`` over ``warmup_steps``, then cosine decay to ``min_lr``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * progress))


def validation_batches(tokens: torch.Tensor, cfg: DictConfig) -> Iterator[torch.Tensor]:
    """The same leading non-overlapping windows of the validation split at every check, so
    validation curves are comparable across steps and runs."""
    width = cfg.seq_len + 1
    n_windows = min(cfg.val_batches * cfg.batch_size, (len(tokens) - 1) // cfg.seq_len)
    rows = tokens[: n_windows * cfg.seq_len + 1].unfold(0, width, cfg.seq_len)  # (N, T+1)
    yield from rows.long().split(cfg.batch_size)


@torch.inference_mode()
def validation_loss(model: Transformer, tokens: torch.Tensor, cfg: DictConfig) -> float:
    model.eval()
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for rows in validation_batches(tokens, cfg):
        rows = rows.to(device)
        logits = model(rows[:, :-1])
        total += F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten(), reduction="sum")
        count += rows[:, 1:].numel()
    model.train()
    return float(total) / count


def train_steps(
    model: Transformer, corpus: Corpus, cfg: DictConfig, writer: SummaryWriter
) -> dict[str, Any]:
    """The optimisation loop; returns the training summary for results.json."""
    tcfg = cfg.train
    device = next(model.parameters()).device
    optimizer = make_optimizer(model, tcfg)
    generator = torch.Generator().manual_seed(cfg.seed)  # batch order depends on the seed only
    recent_losses: deque[float] = deque(maxlen=tcfg.log_every)  # for final_loss
    tokens_seen, train_time = 0, 0.0
    model.train()
    bar = tqdm(range(tcfg.steps), desc=f"train {cfg.encoding.name}", unit="step")
    for step in bar:
        started = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, tcfg)
        x, y = sample_batch(corpus.train, tcfg.batch_size, tcfg.seq_len, generator)
        x, y = x.to(device), y.to(device)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if tcfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg.grad_clip)
        optimizer.step()
        loss_value = loss.item()  # also waits for the device, so the timing below is honest
        train_time += time.perf_counter() - started
        tokens_seen += x.numel()
        recent_losses.append(loss_value)
        if (step + 1) % tcfg.log_every == 0 or step + 1 == tcfg.steps:
            writer.add_scalar("train/loss", loss_value, step + 1)
            writer.add_scalar("train/lr", lr_at(step, tcfg), step + 1)
            writer.add_scalar("train/tokens_per_s", tokens_seen / train_time, step + 1)
            bar.set_postfix(loss=f"{loss_value:.3f}", tok_s=f"{tokens_seen / train_time:,.0f}")
        if (step + 1) % tcfg.val_every == 0 or step + 1 == tcfg.steps:
            val_loss = validation_loss(model, corpus.val, tcfg)
            writer.add_scalar("val/loss", val_loss, step + 1)
            writer.add_scalar("val/ppl", math.exp(val_loss), step + 1)
    bar.close()
    return {
        "steps": tcfg.steps,
        "final_loss": sum(recent_losses) / len(recent_losses),
        "val_ppl": math.exp(val_loss),
        "tokens_per_s": tokens_seen / train_time,
        "wall_s": train_time,
    }


def train(cfg: DictConfig, run_dir: str | Path) -> dict[str, Any]:
    """Train the configured model, evaluate it at every eval length, and write the run.

    Returns the content of ``run_dir/results.json``.
    """
    validate(cfg)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    device = resolve_device(cfg.device)
    corpus = load_corpus(cfg.data)
    torch.manual_seed(cfg.seed)  # model init (and dropout) depend on the seed alone
    model = build_model(cfg.model, cfg.encoding).to(device)
    save_config(run_dir, cfg)
    log.info(
        "%s: %s parameters, %s train / %s val bytes, device %s",
        cfg.encoding.name,
        f"{model.num_parameters():,}",
        f"{len(corpus.train):,}",
        f"{len(corpus.val):,}",
        device,
    )
    with SummaryWriter(log_dir=str(run_dir)) as writer:
        summary = train_steps(model, corpus, cfg, writer)
        save_weights(run_dir, model)
        records = evaluate(
            model,
            corpus.val,
            eval_lengths(cfg),
            cfg.eval.stride,
            cfg.eval.batch_size,
            cfg.eval.max_tokens,
        )
        log_eval_records(writer, records, cfg.train.seq_len)
        results = {
            "encoding": cfg.encoding.name,
            "train_seq_len": cfg.train.seq_len,
            "seed": cfg.seed,
            "parameters": model.num_parameters(),
            "data": {"name": corpus.name, **corpus.stats},
            "train": summary,
            "eval": records,
        }
        write_json(run_dir / RESULTS_FILE, results)
        log_hparams(writer, hparams(cfg), headline_metrics(results))
    return results


def hparams(cfg: DictConfig) -> dict[str, Any]:
    """The knobs that distinguish runs in TensorBoard's HParams tab."""
    return {
        "encoding": cfg.encoding.name,
        "model": f"{cfg.model.n_layer}x{cfg.model.d_model}",
        "data": cfg.data.name,
        "seq_len": cfg.train.seq_len,
        "steps": cfg.train.steps,
        "lr": cfg.train.lr,
        "seed": cfg.seed,
    }


def headline_metrics(results: dict[str, Any]) -> dict[str, float]:
    metrics = {"final_loss": results["train"]["final_loss"], "val_ppl": results["train"]["val_ppl"]}
    for record in results["eval"]:
        if record["status"] == "ok":
            metrics[f"ppl_at_{record['length']}"] = record["ppl"]
    return metrics
