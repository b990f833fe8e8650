"""A trained run evaluated on its own validation data (``evaluate_run``): a corpus's perplexity or
a task's accuracy by length, as training evaluated it at its end.

Each record also names the eval-time extension it measured (``scaling``: "none" when the model
is evaluated as trained, else e.g. "yarn" for a RoPE run, with the factor in
``scaling_factor``); ``rope_scaling_overrides`` builds that extension for a trained rope run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from posbench.config import choice, resolve_device
from posbench.data import Corpus, Task, load_data
from posbench.errors import PosbenchError
from posbench.evaluation.longppl import (
    LONGPPL_ALPHA,
    LONGPPL_BETA,
    KeyTokens,
    check_evaluator,
    key_token_cache,
)
from posbench.evaluation.perplexity import KeySelection, evaluate
from posbench.evaluation.positions import RandomPositions, eval_positions, eval_remap
from posbench.evaluation.task_accuracy import evaluate_task
from posbench.evaluation.temperature import check_temperature, fit_temperature, logit_temperature
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
    temperature: str = "none",
    key_tokens: KeySelection | None = None,
    remap: PositionRemap | None = None,
    compiled: bool = False,
) -> list[dict[str, Any]]:
    """``evaluate`` on a corpus's validation split (with LongPPL over ``key_tokens``' selection,
    if given; ``compiled``: its forward passes through torch.compile, once per length),
    ``evaluate_task`` on a task (its answers scored as ``decode`` says), at
    ``positions`` (None: 0..L-1), under a position ``remap`` (None: as trained; every record
    names it: ``position_remap`` and its settings); ``temperature="fit"``: a corpus's records
    under the logit temperature fitted on its training split (posbench/evaluation/temperature.py;
    ``check_temperature`` refuses it for a task)."""
    with remapped_positions(model, remap):
        if isinstance(data, Corpus):

            def on_validation(at: Sequence[int]) -> list[dict[str, Any]]:
                return evaluate(
                    model,
                    data.val,
                    at,
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
                    key_tokens,
                    compiled,
                )

            records = (
                temperature_records(
                    model, data, lengths, train_seq_len, precision, positions, on_validation
                )
                if temperature == "fit"
                else on_validation(lengths)
            )
        else:
            assert temperature == "none", "check_temperature refuses a temperature for a task"
            if key_tokens is not None:
                raise PosbenchError(
                    f"data={data.config.source} scores answers: LongPPL is a corpus's "
                    "perplexity; drop --metric longppl"
                )
            if stride is not None:
                raise PosbenchError(
                    f"data={data.config.source} scores whole prompts: a stride applies to "
                    "corpora only; drop --stride / eval.stride"
                )
            if compiled:
                raise PosbenchError(
                    f"data={data.config.source} is a task: compiled evaluation compiles a "
                    "corpus's windows (a task's examples and decoding change shape); drop "
                    "--compile / eval.compile"
                )
            records = evaluate_task(model, data, lengths, batch_size, precision, positions, decode)
    return [{**record, **remap_record(remap)} for record in records]


def temperature_records(
    model: Transformer,
    data: Corpus,
    lengths: Sequence[int],
    train_seq_len: int | None,
    precision: str,
    positions: RandomPositions | None,
    on_validation: Callable[[Sequence[int]], list[dict[str, Any]]],
) -> list[dict[str, Any]]:
    """Each length's ``on_validation`` record under the logit temperature fitted for it on the
    training split, with the fit."""
    assert train_seq_len is not None, "a fitted temperature needs the training length"
    fit = fit_temperature(
        model, data.train, train_seq_len, lengths, precision, data.train_documents, positions
    )
    records = []
    for length in lengths:
        with logit_temperature(model, fit.beta(length)):
            (record,) = on_validation([length])
        records.append({**record, **fit.record(length)})
    return records


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
    temperature: str | None = None,
    evaluator: str | Path | None = None,
    alpha: float = LONGPPL_ALPHA,
    beta: float = LONGPPL_BETA,
    position_remap: str | None = None,
    compiled: bool | None = None,
) -> list[dict[str, Any]]:
    """Evaluate a trained run on its own validation split; returns results.json eval records.
    With an ``evaluator`` run (posbench/evaluation/longppl.py), each record also holds LongPPL
    over the key tokens it selects at ``alpha`` and ``beta``, and how they were selected.

    ``max_tokens``, ``precision``, ``positions`` (auto | consecutive | random), ``decode``
    (greedy | teacher_forced), ``temperature`` (none | fit: fitted again at ``lengths``),
    ``position_remap`` (none | self_extend | string) and ``compiled`` default to the run's
    ``eval.max_tokens``, ``eval.precision``, ``eval.positions``, ``eval.decode`` (greedy for
    runs from before it: their records are re-scored the new way), ``eval.temperature``,
    ``eval.position_remap`` and ``eval.compile``, so the numbers are comparable with the ones
    measured at the end of training.
    ``encoding_overrides`` are merged over the run's encoding config before its weights are
    loaded (e.g. ``rope_scaling_overrides``).
    """
    model, cfg = load_run(run_dir, resolve_device(device), encoding_overrides)
    key_tokens = None
    if evaluator is not None:
        judge, judge_cfg = load_run(evaluator, resolve_device(device))
        check_evaluator(cfg, judge, judge_cfg, list(lengths))
        cache = key_token_cache(Path(evaluator), OmegaConf.select(cfg, "data.cache_dir"))
        key_tokens = KeyTokens(judge, cfg.train.seq_len, alpha, beta, cache=cache)
    data = load_data(cfg.data)
    if max_tokens is None:
        max_tokens = cfg.eval.max_tokens
    if precision is None:  # runs from before eval.precision existed evaluated in fp32
        precision = OmegaConf.select(cfg, "eval.precision", default="fp32")
    if decode is None:
        decode = choice(OmegaConf.select(cfg, "eval.decode", default="greedy"))
    if temperature is None:
        temperature = OmegaConf.select(cfg, "eval.temperature", default="none")
    check_temperature(temperature, cfg, lengths)
    if compiled is None:  # runs from before eval.compile existed evaluated eagerly
        compiled = OmegaConf.select(cfg, "eval.compile", default=False)
    records = evaluate_data(
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
        temperature,
        key_tokens,
        eval_remap(cfg, position_remap),
        compiled,
    )
    if key_tokens is None:
        return records
    how = key_tokens.record(Path(evaluator))
    return [{**record, **how} for record in records]


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
