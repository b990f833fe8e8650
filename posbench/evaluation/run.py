"""A trained run evaluated on its own validation data (``evaluate_run``): a corpus's perplexity or
a task's accuracy by length, as training evaluated it at its end.

Each record also names the eval-time extension it measured (``scaling``: "none" when the model
is evaluated as trained, else e.g. "yarn" for a RoPE run, with the factor in
``scaling_factor``); ``rope_scaling_overrides`` builds that extension for a trained rope run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from posbench.config import choice, resolve_device
from posbench.data import Corpus, Task, load_data
from posbench.errors import PosbenchError
from posbench.evaluation.perplexity import evaluate
from posbench.evaluation.positions import RandomPositions, eval_positions, eval_remap
from posbench.evaluation.task_accuracy import evaluate_task
from posbench.model import Transformer
from posbench.model.position_remap import PositionRemap, remap_record, remapped_positions
from posbench.runs.directory import load_run


def evaluate_data(
    model: Transformer,
    data: Corpus | Task,
    lengths: Sequence[int],
    stride: int | None = None,
    batch_size: int | None = None,
    max_tokens: int | None = None,
    train_seq_len: int | None = None,
    precision: str = "fp32",
    positions: RandomPositions | None = None,
    decode: str = "greedy",
    remap: PositionRemap | None = None,
) -> list[dict[str, Any]]:
    """``evaluate`` on a corpus's validation split, ``evaluate_task`` on a task (its answers
    scored as ``decode`` says), at ``positions`` (None: 0..L-1), under a position ``remap``
    (None: as trained; every record names it: ``position_remap`` and its settings)."""
    with remapped_positions(model, remap):
        if isinstance(data, Corpus):
            records = evaluate(
                model,
                data.val,
                lengths,
                stride,
                batch_size,
                max_tokens,
                train_seq_len,
                precision,
                data.val_documents,
                positions,
                data.val_token_bytes,
                data.val_word_starts,
                data.has_words,
            )
        elif stride is not None:
            raise PosbenchError(
                f"data={data.config.source} scores whole prompts: a stride applies to corpora "
                "only; drop --stride / eval.stride"
            )
        else:
            records = evaluate_task(model, data, lengths, batch_size, precision, positions, decode)
    return [{**record, **remap_record(remap)} for record in records]


def evaluate_run(
    run_dir: str | Path,
    lengths: Sequence[int],
    stride: int | None = None,
    batch_size: int | None = None,
    device: str = "auto",
    max_tokens: int | None = None,
    encoding_overrides: Mapping[str, Any] | None = None,
    precision: str | None = None,
    positions: str | None = None,
    decode: str | None = None,
    position_remap: str | None = None,
) -> list[dict[str, Any]]:
    """Evaluate a trained run on its own validation split; returns results.json eval records.

    ``max_tokens``, ``precision``, ``positions`` (auto | consecutive | random), ``decode``
    (greedy | teacher_forced) and ``position_remap`` (none | self_extend | string) default to
    the run's ``eval.max_tokens``, ``eval.precision``, ``eval.positions``, ``eval.decode``
    (greedy for runs from before it: their records are re-scored the new way) and
    ``eval.position_remap``, so the numbers are comparable with the ones measured at the end of
    training. ``encoding_overrides`` are merged over the run's encoding config before its
    weights are loaded (e.g. ``rope_scaling_overrides``).
    """
    model, cfg = load_run(run_dir, resolve_device(device), encoding_overrides)
    data = load_data(cfg.data)
    if max_tokens is None:
        max_tokens = cfg.eval.max_tokens
    if precision is None:  # runs from before eval.precision existed evaluated in fp32
        precision = OmegaConf.select(cfg, "eval.precision", default="fp32")
    if decode is None:
        decode = choice(OmegaConf.select(cfg, "eval.decode", default="greedy"))
    return evaluate_data(
        model,
        data,
        lengths,
        stride,
        batch_size,
        max_tokens,
        cfg.train.seq_len,
        precision,
        eval_positions(cfg, positions),
        decode,
        eval_remap(cfg, position_remap),
    )


ROPE_SCALING_NEEDS_ROPE = "RoPE scaling needs a run trained with encoding=rope"


def rope_scaling_overrides(
    cfg: DictConfig, method: str, factor: float | None = None
) -> dict[str, Any]:
    """Encoding overrides that evaluate the rope run configured by ``cfg`` with an eval-time
    scaling ``method`` (posbench.encodings.rope.SCALING_METHODS) and ``factor`` (None: from each
    length). The original length is the run's training length, never the evaluation length."""
    if cfg.encoding.name != "rope":
        raise PosbenchError(f"{ROPE_SCALING_NEEDS_ROPE}; this run used {cfg.encoding.name!r}")
    trained = OmegaConf.select(cfg, "encoding.scaling.original_length") or cfg.train.seq_len
    return {"scaling": {"method": method, "factor": factor, "original_length": trained}}
