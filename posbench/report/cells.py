"""A report's cells: the mean and sample std of what a row's runs measured at one length
(perplexity or the report's metric, its ratio to the training length, accuracies), refused
where the runs did not measure alike; loss by position and passkey depth over the runs."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from posbench.report.read import Run, identity_config
from posbench.report.run_table import no_reference
from posbench.runs.results import (
    eval_protocol,
    headline_accuracy,
    protocol_text,
    training_length_ppl,
)


@dataclass(frozen=True)
class Stat:
    """Mean and sample standard deviation (n - 1) of ``n`` values; ``std`` is None below 2.
    ``values`` themselves (one per run) for what else is read from them: the best seed, the
    share that succeed (aggregate.py)."""

    n: int
    mean: float | None
    std: float | None
    values: tuple[float, ...] = ()

    @classmethod
    def of(cls, values: Sequence[float]) -> Stat:
        if not values:
            return cls(0, None, None)
        std = statistics.stdev(values) if len(values) > 1 else None
        return cls(len(values), statistics.fmean(values), std, tuple(values))


NOT_MEASURED = Stat(0, None, None)  # a Stat of no values: a default


@dataclass(frozen=True)
class Cell:
    length: int
    ppl: Stat
    value: Stat  # the report's metric (ppl, bits_per_byte or word_ppl), per run
    ratio: Stat  # value(length) / value(train length) of the same protocol, per run
    unsupported: str | None  # the reason, when no run could measure this length
    accuracy: Stat = NOT_MEASURED  # a task's answer bytes right in its own answer
    sequence_accuracy: Stat = NOT_MEASURED  # a task's examples right in full, per run
    documents: tuple[int, ...] = ()  # the documents its runs scored (distinct counts), if any
    missing: dict[str, str] = field(default_factory=dict)  # metric -> why a measured cell has none


@dataclass(frozen=True)
class PositionCurve:
    """A row's loss by position at its group's ``position_length``, over its runs (seeds).

    ``before`` / ``after``: each run's token-weighted mean NLL of the buckets at positions
    below / from the training length S; ``ratio``: each run's after / before (None when the
    window holds no position >= S).
    """

    buckets: list[tuple[int, int]]  # [start, end) positions
    nll: list[Stat]  # per bucket
    before: Stat
    after: Stat
    ratio: Stat


def problem_lengths(run: Run) -> tuple[int, int] | None:
    """The training range of a run on an algorithmic task (None: any other run)."""
    lengths = run.config.get("data.train_lengths")
    return None if lengths is None else (lengths[0], lengths[1])


def reference_value(run: Run, record: dict[str, Any], metric: str) -> float | None:
    """The run's ``metric`` at its training length measured as ``record`` was (the same
    ``eval_protocol``): what ``record``'s ratio divides by. None for an algorithmic task,
    whose evaluation lengths are problem lengths, not multiples of a window."""
    if problem_lengths(run) is not None:
        return None
    records, seq_len = run.results["eval"], run.config["train.seq_len"]
    return training_length_ppl(records, seq_len, metric).get(eval_protocol(record))


def depth_accuracy(measured: Sequence[tuple[Run, dict]]) -> dict[int, Stat] | None:
    """The runs' passkey accuracy (of the greedy decode) at each needle depth, over runs; None
    when none has one."""
    per_depth: dict[int, list[float]] = defaultdict(list)
    for _, record in measured:
        if headline_accuracy(record) is None:  # teacher-forced
            continue
        for entry in record.get("accuracy_by_depth", []):
            per_depth[entry["depth_percent"]].append(entry["accuracy"])
    return {depth: Stat.of(values) for depth, values in sorted(per_depth.items())} or None


def nll_split(buckets: Sequence[dict[str, Any]], train_seq_len: int) -> tuple[float, float | None]:
    """Token-weighted mean NLL of the buckets before the training length, and from it on
    (None when the window ends at or before it). The training length is a bucket boundary."""

    def mean(part: list[dict[str, Any]]) -> float | None:
        tokens = sum(b["tokens"] for b in part)
        return sum(b["nll"] * b["tokens"] for b in part) / tokens if tokens else None

    before = mean([b for b in buckets if b["end"] <= train_seq_len])
    after = mean([b for b in buckets if b["start"] >= train_seq_len])
    return before, after


def position_curve(
    measured: Sequence[tuple[Run, dict]], train_seq_len: int
) -> PositionCurve | None:
    """The runs' loss by position averaged per bucket; None when none of them has one."""
    curves = [r["loss_by_position"] for _, r in measured if "loss_by_position" in r]
    if not curves:
        return None
    buckets = [(b["start"], b["end"]) for b in curves[0]]
    assert all([(b["start"], b["end"]) for b in c] == buckets for c in curves), "same S, length"
    nll = [Stat.of([c[i]["nll"] for c in curves]) for i in range(len(buckets))]
    splits = [nll_split(c, train_seq_len) for c in curves]
    afters = [(before, after) for before, after in splits if after is not None]
    return PositionCurve(
        buckets,
        nll,
        Stat.of([before for before, _ in splits]),
        Stat.of([after for _, after in afters]),
        Stat.of([after / before for before, after in afters]),
    )


def unlike_evaluations(measured: Sequence[tuple[Run, dict]]) -> str | None:
    """Why the records of one row at one length are no sample of one measurement over seeds,
    or None: they scored different numbers of tokens (a run re-evaluated with ``posbench eval
    --max-tokens``), or two of them are one seed (one model evaluated in other ways)."""
    ok = [(run, r) for run, r in measured if r["status"] == "ok"]
    tokens = sorted({r["tokens"] for _, r in ok if r.get("tokens") is not None})
    if len(tokens) > 1:
        counts = ", ".join(f"{n:,}" for n in tokens)
        return (
            f"its runs scored different numbers of tokens here ({counts}): not averaged; "
            "evaluate them alike (eval.max_tokens, posbench eval --max-tokens)"
        )
    by_seed: dict[Any, list[Run]] = defaultdict(list)
    for run, _ in ok:
        by_seed[run.config.get("seed")].append(run)
    for seed, same in by_seed.items():
        if seed is not None and len(same) > 1:  # None: a config that does not say
            configs = [identity_config(run) for run in same]
            keys = sorted(
                k for k in set().union(*configs) if len({json.dumps(c.get(k)) for c in configs}) > 1
            )
            return (
                f"{len(same)} of its runs are seed {seed}, differing in {', '.join(keys)}: one "
                "model evaluated in other ways, not averaged as seeds; report one of them"
            )
    return None


def alike(measured: Sequence[tuple[Run, dict]]) -> Sequence[tuple[Run, dict]]:
    """``measured``, or nothing where its records may not be averaged (unlike_evaluations)."""
    return [] if unlike_evaluations(measured) else measured


def no_value(metric: str, records: Sequence[dict[str, Any]]) -> str:
    """Why measured ``records`` hold no ``metric``."""
    if metric == "longppl" and not any(metric in r for r in records):
        return "its records have no longppl: posbench eval --metric longppl --evaluator RUN"
    if not any(metric in r for r in records):
        return f"its records have no {metric} (written before posbench measured it)"
    if metric == "word_ppl":  # measured as null: text only
        return "word_ppl is null in its records: its data delimits no words (synthetic, a task)"
    if metric == "longppl":
        return "longppl is null in its records: its evaluator selected no key token there"
    return f"{metric} is null in its records"


def cell(length: int, measured: Sequence[tuple[Run, dict]], metric: str = "ppl") -> Cell:
    if (why := unlike_evaluations(measured)) is not None:
        empty = Stat.of([])
        refused = {part: why for part in ("value", "ratio", "accuracy", "sequence_accuracy")}
        return Cell(length, empty, empty, empty, None, missing=refused)
    ok_records = [(run, r) for run, r in measured if r["status"] == "ok"]
    ok = [(run, r["ppl"]) for run, r in ok_records]
    # Records from before a metric existed (word_ppl) or without it (a task's) have none.
    valued = [(run, r) for run, r in ok_records if r.get(metric) is not None]
    ratios = [
        r[metric] / ref for run, r in valued if (ref := reference_value(run, r, metric)) is not None
    ]
    missing = {}
    if ok and not valued:
        missing["value"] = no_value(metric, [r for _, r in ok_records])
    if valued and not ratios and metric == "longppl":
        missing["ratio"] = (
            "LongPPL at the training length is null: no token there has more context in the "
            "window than in the training length, so none is key and no ratio divides by it"
        )
    elif valued and not ratios:  # measured, but no run measured the training length that way
        run, record = valued[0]
        missing["ratio"] = no_reference(run.config["train.seq_len"], protocol_text(record))
    reasons = sorted({r["reason"] for _, r in measured if r["status"] != "ok"})
    unsupported = "; ".join(reasons) if reasons and not ok else None
    scored = [r for _, r in measured if r.get("sequence_accuracy") is not None]
    own_accuracies = [a for r in scored if (a := headline_accuracy(r)) is not None]
    documents = {count for _, r in ok_records if (count := r.get("documents")) is not None}
    return Cell(
        length,
        Stat.of([ppl for _, ppl in ok]),
        Stat.of([r[metric] for _, r in valued]),
        Stat.of(ratios),
        unsupported,
        Stat.of(own_accuracies),
        Stat.of([r["sequence_accuracy"] for r in scored]),
        tuple(sorted(documents)),
        missing,
    )
