"""results.json, a run's record of what ran and what it measured: written as the run goes
(what ran, how training ended, one record per evaluated length), read back by ``posbench eval``
and ``posbench report``, and the helpers that say how a record was measured (its protocol,
scaling, positions, decoding) and which records compare.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from posbench.data import Corpus, Task
from posbench.errors import PosbenchError
from posbench.model import Transformer
from posbench.runs.directory import RESULTS_FILE
from posbench.system import distributed
from posbench.system.atomic import write_json
from posbench.system.machine import ran
from posbench.system.versions import code_versions


def read_results(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / RESULTS_FILE
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise PosbenchError(f"{path} is not valid JSON ({err}); delete or restore it") from None


def write_results(run_dir: Path, results: dict[str, Any]) -> None:
    write_json(Path(run_dir) / RESULTS_FILE, results)


# results.json of a training run, assembled as the run goes: what ran (run_description), then
# how training ended (training/train_loop.py's train_summary, or the diverged record), then one
# record per evaluated length.


def run_description(
    cfg: DictConfig,
    model: Transformer,
    data: Corpus | Task,
    precision: str,
    threads: int,
    command: str | None = None,
) -> dict[str, Any]:
    """What results.json says about a run besides its numbers: status "ok" until something
    says otherwise, the encoding and its own settings (e.g. t5's num_buckets, rope's scaling),
    training length and seed, the ``threads`` and ranks it ran on, its size, the precision it
    trained in (what ``auto`` resolved to), its data (with its tokenizer and vocabulary) and
    the run it started from
    (``train.init_from``, as an absolute path), the code that ran it (system/versions.py), and
    the ``command`` that started it, on which machine, which day (system/machine.py)."""
    options = OmegaConf.to_container(cfg.encoding, resolve=True, enum_to_str=True)
    options.pop("name")
    init_from = cfg.train.init_from
    return {
        "status": "ok",
        "encoding": cfg.encoding.name,
        "encoding_options": options,
        "train_seq_len": cfg.train.seq_len,
        "seed": cfg.seed,
        "threads": threads,
        "world_size": distributed.world_size(),
        "parameters": model.num_parameters(),
        "precision": precision,
        "data": {
            "name": data.name,
            # data.tokenizer as configured (bytes, bpe, a file, a hub name); tasks are bytes
            "tokenizer": OmegaConf.select(cfg, "data.tokenizer", default="bytes"),
            "vocab_size": data.vocab_size,
            **data.stats,
            # how a task asked for its answers (posbench/data/task.py's AnswerMode)
            **({"answer_mode": data.answer_mode.value} if isinstance(data, Task) else {}),
        },
        "init_from": None if init_from is None else str(Path(init_from).resolve()),
        "versions": code_versions(),
        "ran": ran(command),
    }


def diverged_results(
    description: dict[str, Any], steps: int, step: int, last_finite_loss: float | None
) -> dict[str, Any]:
    """results.json of a run of ``steps`` whose loss became NaN or infinite at ``step``: no
    evaluation."""
    train = {"steps": steps, "diverged_at_step": step, "last_finite_loss": last_finite_loss}
    return {**description, "status": "diverged", "train": train, "eval": []}


def scaling_method(record: Mapping[str, Any]) -> str:
    """The eval-time extension an eval record was measured with ("none": as trained). Records
    written before eval-time scaling existed have no ``scaling`` field: they are plain."""
    return record.get("scaling") or "none"


def scaling_setting(record: Mapping[str, Any]) -> float | None:
    """The scaling factor an eval record was configured with: None when s followed each length
    (and for records written before the ``scaling_factor_setting`` field existed)."""
    return record.get("scaling_factor_setting")


def scaling_name(record: Mapping[str, Any]) -> str:
    """The eval-time extension as one name: "none", "yarn" (s from each length) or "yarn s=4"
    (a configured factor): one report row, table entry and TensorBoard series per name."""
    method, setting = scaling_method(record), scaling_setting(record)
    return method if setting is None else f"{method} s={setting:g}"


def positions_mode(record: Mapping[str, Any]) -> str:
    """How an eval record numbered its windows' positions: "consecutive" (0, 1, ...; also
    records written before the ``positions`` field existed) or "random"."""
    return record.get("positions") or "consecutive"


def decode_mode(record: Mapping[str, Any]) -> str | None:
    """How a task's eval record scored its answers: "greedy" (the model's own decode),
    "teacher_forced" (also autoregressive records written before the ``decode`` field existed)
    or None for answers at placeholders (one forward pass writes them: nothing to decode)."""
    if record.get("answer_mode") == "placeholders":
        return None
    return record.get("decode") or "teacher_forced"


def headline_accuracy(record: Mapping[str, Any]) -> float | None:
    """A task's eval record's share of answer tokens right in the model's own answer: at
    placeholders, its one forward pass's; autoregressive, its greedy decode's. None when it
    was scored under teacher forcing (records from before the ``decode`` field were, and hold
    the teacher-forced share as ``accuracy``), but where the task's paper scores it so
    (``protocol_decode``: flip_flop's reads, each given the true sequence before it)."""
    if decode_mode(record) == "teacher_forced" and "protocol_decode" not in record:
        return None
    return record.get("accuracy")


def eval_protocol(record: Mapping[str, Any]) -> tuple:
    """How an eval record was measured, its length aside: stride, eval-time scaling method and
    factor setting (not the factor, which follows each length when unset), positions. A ratio
    compares a record with the one at the training length of the same protocol (precision is
    not part of it: a length re-evaluated in another precision replaces its record)."""
    return (
        record["stride"],
        scaling_method(record),
        scaling_setting(record),
        positions_mode(record),
    )


def protocol_text(record: Mapping[str, Any]) -> str:
    """A record's protocol in words: "stride 64, yarn s=4, random positions"."""
    stride = record["stride"]
    parts = ["non-overlapping windows" if stride is None else f"stride {stride}"]
    parts.append("no scaling" if scaling_method(record) == "none" else scaling_name(record))
    parts.append(f"{positions_mode(record)} positions")
    return ", ".join(parts)


def training_length_ppl(
    records: Iterable[Mapping[str, Any]], train_seq_len: int, metric: str = "ppl"
) -> dict:
    """Each protocol's (``eval_protocol``) measured perplexity (or another ``metric`` of the
    records: bits_per_byte, word_ppl) at the training length: what a record's ratio
    ppl / ppl(training length) divides by."""
    return {
        eval_protocol(r): r[metric]
        for r in records
        if r["length"] == train_seq_len and r["status"] == "ok" and r.get(metric) is not None
    }


def record_key(record: Mapping[str, Any]) -> tuple:
    """What identifies one measurement: the same key measured again replaces the old record.
    Its length, protocol and the factor used, so the same method at different factors is kept
    side by side; but a fitted temperature's beta (``scaling`` "temperature") follows its fit,
    so a fit made again (``posbench eval --temperature fit``) replaces the record. And LongPPL's
    evaluator: a LongPPL record and a plain one (or one of another evaluator) stand side by
    side, their perplexities alike (readers take one per measurement: one_per_measurement)."""
    fitted = scaling_method(record) == "temperature"
    factor = None if fitted else record.get("scaling_factor")
    return (record["length"], *eval_protocol(record), factor, record.get("longppl_evaluator"))


def one_per_measurement(
    records: Iterable[Mapping[str, Any]], longppl: bool = False
) -> list[Mapping[str, Any]]:
    """``records`` (one run's) with one record of each measurement (``record_key`` but the
    evaluator): the plain record, else the first LongPPL one; with ``longppl``, the first
    LongPPL record, else the plain one. Averaging both would count the run twice."""
    chosen: dict[tuple, Mapping[str, Any]] = {}
    for record in sorted(records, key=lambda r: (record_key(r)[-1] is None) == longppl):
        chosen.setdefault(record_key(record)[:-1], record)
    return list(chosen.values())


def merge_eval_records(results: dict[str, Any], records: Iterable[dict[str, Any]]) -> dict:
    """``results`` with ``records`` added; records of other lengths, strides, scaling methods,
    factors or positions are kept as they are. Sorted by length, then stride, then method
    (plain first), then factor (from each length first), then positions."""
    new = {record_key(r): r for r in records}
    kept = [r for r in results.get("eval", []) if record_key(r) not in new]

    def order(record: dict[str, Any]) -> tuple:
        length, stride, scaling, setting, positions, _, evaluator = record_key(record)
        plain = (length, stride or 0, scaling != "none", scaling, setting is not None)
        return (*plain, setting or 0, positions, evaluator or "")

    merged = sorted([*kept, *new.values()], key=order)
    return {**results, "eval": merged}


def with_length_generalization(results: dict[str, Any], longest_trained: int) -> dict[str, Any]:
    """``results`` of a run on an algorithmic task trained at problem lengths up to
    ``longest_trained``, with Ruoss et al.'s summary of its eval records over the lengths
    beyond: ``length_generalization``, the mean sequence accuracy (the whole answer right),
    and ``length_generalization_accuracy``, the mean accuracy per answer token of the model's
    own answer (``headline_accuracy``: at placeholders the per-token accuracy their Table 1
    averages over lengths 41 to 500, autoregressive answers' greedy decode; None when a length
    was scored under teacher forcing only). None when no such length was measured, or when one
    of them could not be (a learned table too short for it): a mean over the lengths a model
    happens to support would not compare with one over all of them."""
    beyond = [r for r in results["eval"] if r["length"] > longest_trained]
    summary: dict[str, Any] = dict.fromkeys(
        ["length_generalization", "length_generalization_accuracy"]
    )
    if beyond and all(r["status"] == "ok" for r in beyond):
        summary = {
            "length_generalization": sum(r["sequence_accuracy"] for r in beyond) / len(beyond),
            "length_generalization_accuracy": mean_of([headline_accuracy(r) for r in beyond]),
        }
    return {**results, **summary}


def mean_of(values: list[float | None]) -> float | None:
    """The mean of ``values``; None when one of them is None."""
    return None if None in values else sum(values) / len(values)


# Effective context length: the longest evaluated length up to which a run's score stays
# within a threshold of its score at the training length (RULER's effective context length,
# Hsieh et al. 2024, https://arxiv.org/abs/2404.06654, made relative).
#
# RULER calls a length effective while the score there stays above an absolute bar (85.6 %, its
# Llama-2-7B's). A tiny model's score at its own training length is no such bar, so the bar is
# relative: with threshold t (``--effective-threshold``, default 0.9), a length L >= S (the
# training length) is within it when
#
#     accuracy(L)   >= t * accuracy(S)      (a task: the model's own answers, headline_accuracy)
#     perplexity(L) <= perplexity(S) / t    (a corpus; or bits_per_byte, word_ppl in a report)
#
# and the effective length is the longest evaluated L such that every evaluated length from S to
# L is within it (a length that could not be measured, ``unsupported``, ends the run of lengths).
# None when S itself was not measured the same way, and for a task whose accuracy at S is no
# better than its best prompt-blind baseline there (chance, the constant answer:
# baseline_accuracy): a model at chance stays within any threshold at every length, which says
# nothing of its context. Lengths below S are not read: fewer tokens of context raise
# perplexity even for a model that extrapolates perfectly.
#
# Each protocol (stride, eval-time scaling, positions: results.eval_protocol) is its own series.
# results.json holds them as ``effective_context_length`` at DEFAULT_EFFECTIVE_THRESHOLD;
# ``posbench report --effective-threshold`` recomputes them at any other.

DEFAULT_EFFECTIVE_THRESHOLD = 0.9
PROTOCOL_FIELDS = ("stride", "scaling", "scaling_factor_setting", "positions")  # eval_protocol
HIGHER_IS_BETTER = {"accuracy"}  # every other score is a perplexity or bits


def baseline_accuracy(record: Mapping[str, Any]) -> float | None:
    """The best of a task's eval record's prompt-blind baselines at its length (chance, the
    constant answer); None for a corpus's record, or where none was drawn."""
    values = [record.get(key) for key in ("chance_accuracy", "constant_answer_accuracy")]
    return max((v for v in values if v is not None), default=None)


def effective_length(
    scores: Mapping[int, float | None],
    train_length: int,
    threshold: float,
    metric: str,
    floor: float | None = None,
) -> int | None:
    """The effective length of ``scores`` (length -> ``metric`` there; None: not measured)
    relative to the score at ``train_length``, as the comment above defines it; ``floor``: an
    accuracy's best prompt-blind baseline at ``train_length`` (baseline_accuracy)."""
    reference = scores.get(train_length)
    if reference is None or (floor is not None and reference <= floor):
        return None
    effective = None
    for length in sorted(n for n in scores if n >= train_length):
        score = scores[length]
        if score is None:
            break
        if metric in HIGHER_IS_BETTER:
            within = score >= threshold * reference
        else:
            within = score <= reference / threshold
        if not within:
            break
        effective = length
    return effective


def record_score(record: Mapping[str, Any], metric: str | None = None) -> tuple[str, float | None]:
    """The score an eval record's effective length is read from, and its name: a task's
    accuracy of its own answers, else ``metric`` (None: ppl); None when not measured."""
    if "sequence_accuracy" in record:  # a task's record
        return "accuracy", headline_accuracy(record) if record["status"] == "ok" else None
    metric = metric or "ppl"
    return metric, record.get(metric) if record["status"] == "ok" else None


def effective_context_lengths(
    records: Iterable[Mapping[str, Any]],
    train_seq_len: int,
    threshold: float = DEFAULT_EFFECTIVE_THRESHOLD,
) -> list[dict[str, Any]]:
    """results.json's ``effective_context_length``: one entry per protocol of ``records``
    (a run's eval records), with the score it is read from and the score at the training
    length."""
    series: dict[tuple, dict[int, float | None]] = defaultdict(dict)
    floors: dict[tuple, float | None] = {}
    for record in records:
        metric, score = record_score(record)
        key = (*eval_protocol(record), metric)
        series[key][record["length"]] = score
        if record["length"] == train_seq_len:
            floors[key] = baseline_accuracy(record)
    return [
        {
            "metric": key[-1],
            "threshold": threshold,
            "length": effective_length(scores, train_seq_len, threshold, key[-1], floors.get(key)),
            "train_seq_len": train_seq_len,
            "score_at_train_seq_len": scores.get(train_seq_len),
            **dict(zip(PROTOCOL_FIELDS, key[:-1], strict=True)),
        }
        for key, scores in series.items()
    ]


def with_effective_context_length(results: dict[str, Any]) -> dict[str, Any]:
    """``results`` with its ``effective_context_length`` entries recomputed from all its eval
    records at DEFAULT_EFFECTIVE_THRESHOLD (``posbench report`` reads them at any other)."""
    entries = effective_context_lengths(results["eval"], results["train_seq_len"])
    return {**results, "effective_context_length": entries}


def as_trained(entry: Mapping[str, Any]) -> bool:
    """Whether an ``effective_context_length`` entry is of the records measured as the run was
    trained: non-overlapping windows, no eval-time scaling."""
    return entry["stride"] is None and entry["scaling"] == "none"


def append_eval_results(
    run_dir: Path, records: list[dict[str, Any]], longest_trained: int | None = None
) -> dict[str, Any]:
    """Add evaluation records to the run's results.json (atomically) and return the new content;
    with ``longest_trained`` (an algorithmic task's), its ``with_length_generalization``
    summary is recomputed from all its records, else its ``effective_context_length``."""
    results = merge_eval_records(read_results(run_dir), records)
    if longest_trained is not None:
        results = with_length_generalization(results, longest_trained)
    elif "train_seq_len" in results:  # an algorithmic task's lengths are problem lengths
        results = with_effective_context_length(results)
    write_results(run_dir, results)
    return results
