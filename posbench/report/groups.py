"""A sweep's numbers: runs grouped by training setting and tokens scored (never averaged across
them), rows by encoding and evaluation protocol, cells of mean and sample std over the runs
(seeds), a run repeated counted once."""

from __future__ import annotations

import json
import os
import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posbench.data import TASKS, load_data
from posbench.errors import PosbenchError
from posbench.references import Reference, ReferenceTable
from posbench.report.aggregate import DEFAULT_SUCCESS_THRESHOLD, baselines_over
from posbench.report.cells import (
    NOT_MEASURED,
    Cell,
    PositionCurve,
    Stat,
    alike,
    cell,
    depth_accuracy,
    position_curve,
    problem_lengths,
)
from posbench.report.read import (
    Duplicate,
    Excluded,
    Run,
    drop_duplicates,
    find_runs,
)
from posbench.report.settings import (
    chosen_metric,
    encoding_labels,
    group_settings,
    group_title,
    group_titles,
    tokenizer_text,
)
from posbench.report.summary import is_summary
from posbench.runs.directory import saved_config
from posbench.runs.results import (
    DEFAULT_EFFECTIVE_THRESHOLD,
    baseline_accuracy,
    decode_mode,
    effective_length,
    one_per_measurement,
    positions_mode,
    record_score,
    scaling_name,
)

# An encoding whose mean perplexity at the training length is more than this many times the
# best encoding's did not learn comparably (e.g. under-trained): a flat ratio from a high start
# says nothing about extrapolating.
COMPARABLE_PPL = 1.5
# What a report tabulates and draws (``posbench report --metric``), each with its ratio to the
# training length: perplexity per token, and the two that compare runs across tokenizers.
METRICS = {
    "ppl": "Perplexity",
    "bits_per_byte": "Bits per byte (total NLL / ln 2 over the UTF-8 bytes scored)",
    "word_ppl": "Word-level perplexity (exp of the total NLL over the words scored)",
    "longppl": "LongPPL (perplexity over the key tokens an evaluator run selects: posbench eval "
    "--metric longppl)",
}


@dataclass
class Row:
    label: str  # "rope", "rope + yarn", "rope + yarn s=4", "rope, stride 64", "rope (base=500)"
    encoding: str
    scaling: str  # "none", "yarn" (s from each length), "yarn s=4" (a configured factor)
    stride: int | None
    # how its windows' positions were numbered, when not as its runs were trained to ("random":
    # train.random_positions); None: as trained (eval.positions=auto)
    positions: str | None = None
    runs: list[Path] = field(default_factory=list)
    cells: list[Cell] = field(default_factory=list)
    by_position: PositionCurve | None = None  # none for sliding windows
    by_depth: dict[int, Stat] | None = None  # passkey: accuracy per needle depth (percent)
    not_comparable: str | None = None  # why its ratios say little (mark_not_comparable)
    # how its runs' precision differs from most of the table's (mark_other_precision)
    other_precision: str | None = None
    # an algorithmic task's: its runs' length_generalization(_accuracy) (runs/results.py)
    generalization: Stat = NOT_MEASURED
    generalization_accuracy: Stat = NOT_MEASURED
    # its runs' effective context lengths (runs.results.effective_length) at the report's
    # threshold, and the score they are read from ("accuracy" for a task, else the metric)
    effective: Stat = NOT_MEASURED
    effective_metric: str = ""
    # its runs' attention-sink rates (posbench diagnose's results.json ``sink``) by (length,
    # eps, k); only on the row measured as trained: a diagnosis is of the model, not a protocol
    sink: dict[tuple[int, float, int], Stat] = field(default_factory=dict)
    name: str = ""  # its runs' encoding.name: "rope" for "rope (base=500)" or "rope [bpe 8192]"
    tokenizer: str = "bytes"  # its runs' (tokenizer_text): perplexities compare within one

    @property
    def as_trained(self) -> bool:
        """Whether its records are measured as its runs were trained: non-overlapping windows,
        no eval-time scaling, the positions of training."""
        return self.scaling == "none" and self.stride is None and self.positions is None


@dataclass
class Group:
    name: str  # "" when the report has one group, else "group<N>" (file and directory names)
    title: str
    setting: dict[str, Any]  # the keys whose values tell this group from the others
    train_seq_len: int
    lengths: list[int]
    rows: list[Row]
    position_length: int | None = None  # the longest length with loss by position
    depth_length: int | None = None  # the longest length with passkey accuracy by depth
    # an algorithmic task's training range [lo, hi]: its lengths are problem lengths
    problem_lengths: tuple[int, int] | None = None
    task: str | None = None  # and that task's data.name
    # what its accuracy past the training range is read against, over the lengths evaluated
    # there (aggregate.BASELINES, from its records; for runs written before records held them,
    # data.chance_accuracy and Task.constant_answer_accuracy length by length): a uniform
    # guess, the best answer that reads only the prompt's length, and the best rule that reads
    # only the answer's earlier bytes; None where unknown
    chance_accuracy: float | None = None
    constant_answer_accuracy: float | None = None
    prefix_rule_accuracy: float | None = None
    # whether its Table 1 accuracy per byte is scored under teacher forcing: its runs' records
    # are all autoregressive ones not decoded (written before greedy decoding became the
    # accuracy, or eval.decode=teacher_forced: teacher_forced_scores); the prefix rule is a
    # baseline for it then, not for a decode's nor for answers at placeholders
    teacher_forced: bool = True
    reference: ReferenceTable | None = None  # the --reference's table of its training length
    tokenizers: list[str] = field(default_factory=list)  # its runs' (tokenizer_text), sorted


@dataclass
class Report:
    root: Path  # the directory its runs' paths are relative to: the one DIR, or the DIRs' parent
    dirs: list[Path]  # the directories searched for runs (posbench report DIR [DIR ...])
    groups: list[Group]
    excluded: list[Excluded]
    metric: str = "ppl"  # what its cells' value and ratio are (METRICS)
    reference: Reference | None = None  # published numbers it is read against (--reference)
    # The code its runs ran (results.json's versions, and a re-evaluation's; None: not
    # recorded), most runs first, with how many runs each: one config and seed can give other
    # numbers under other code.
    code: list[tuple[dict[str, Any] | None, int]] = field(default_factory=list)
    # a seed succeeds on an algorithmic task when its summary is above this (--success-threshold)
    success_threshold: float = DEFAULT_SUCCESS_THRESHOLD
    # the share of its score at the training length a length keeps to be effective
    # (--effective-threshold)
    effective_threshold: float = DEFAULT_EFFECTIVE_THRESHOLD
    # runs left out because a newer one has their config and seed (not two seeds)
    duplicates: list[Duplicate] = field(default_factory=list)
    # why the metric is what it is, when the runs' tokenizers chose it (chosen_metric)
    metric_note: str | None = None


def row_label(encoding: str, scaling: str, stride: int | None, positions: str | None) -> str:
    label = encoding if scaling == "none" else f"{encoding} + {scaling}"
    label = label if stride is None else f"{label}, stride {stride}"
    return label if positions is None else f"{label}, {positions} positions"


def other_positions(run: Run, record: dict[str, Any]) -> str | None:
    """The record's positions mode when it is not the one the run evaluates at by default
    (random for a run trained with train.random_positions, else consecutive), else None."""
    trained = "consecutive" if run.config.get("train.random_positions") is None else "random"
    mode = positions_mode(record)
    return None if mode == trained else mode


def effective_lengths(
    by_length: dict[int, list[tuple[Run, dict]]],
    train_seq_len: int,
    metric: str,
    threshold: float,
) -> tuple[Stat, str]:
    """A row's effective context lengths over its runs, from its records ``by_length``, and
    the score they are read from (a task's accuracy, else ``metric``)."""
    scores: dict[Path, dict[int, float | None]] = defaultdict(dict)
    floors: dict[Path, float | None] = {}
    name = metric
    for length, measured in by_length.items():
        for run, record in measured:
            name, scores[run.path][length] = record_score(record, metric)
            if length == train_seq_len:
                floors[run.path] = baseline_accuracy(record)
    lengths = [
        effective_length(s, train_seq_len, threshold, name, floors.get(path))
        for path, s in scores.items()
    ]
    return Stat.of([n for n in lengths if n is not None]), name


def build_group(
    runs: Sequence[Run],
    name: str,
    title: str,
    setting: dict[str, Any],
    metric: str = "ppl",
    effective_threshold: float = DEFAULT_EFFECTIVE_THRESHOLD,
) -> Group:
    labels = encoding_labels(runs)
    names = {labels[run.path]: run.config["encoding.name"] for run in runs}
    tokenizers = {labels[run.path]: tokenizer_text(run) for run in runs}
    # (label, scaling name, stride, other positions) -> length -> the runs' records there
    table: dict[tuple, dict[int, list[tuple[Run, dict]]]] = defaultdict(lambda: defaultdict(list))
    row_runs: dict[tuple, list[Path]] = defaultdict(list)
    for run in runs:
        for record in one_per_measurement(run.results["eval"], longppl=metric == "longppl"):
            key = (
                labels[run.path],
                scaling_name(record),
                record["stride"],
                other_positions(run, record),
            )
            table[key][record["length"]].append((run, record))
            if run.path not in row_runs[key]:
                row_runs[key].append(run.path)
    lengths = sorted({length for by_length in table.values() for length in by_length})
    teacher_forced = teacher_forced_scores([run.results for run in runs])
    rows = []
    sorted_keys = sorted(table, key=lambda k: (k[0], k[1] != "none", k[1], k[2] or 0, k[3] or ""))
    for key in sorted_keys:
        label, scaling, stride, positions = key
        shown = row_label(label, scaling, stride, positions)
        row = Row(shown, label, scaling, stride, positions, row_runs[key], name=names[label])
        row.tokenizer = tokenizers[label]
        row.cells = [cell(length, table[key].get(length, []), metric) for length in lengths]
        if problem_lengths(runs[0]) is None:  # problem lengths are no multiple of a window
            row.effective, row.effective_metric = effective_lengths(
                table[key], runs[0].config["train.seq_len"], metric, effective_threshold
            )
        results = [run.results for run in runs if run.path in row.runs]
        if row.as_trained:
            row.sink = sink_rates(results)
        row.generalization = Stat.of(summary_values(results, "length_generalization"))
        # A teacher-forced accuracy is never averaged with the model's own answers' accuracies.
        answered = results if teacher_forced else [r for r in results if own_answers(r)]
        row.generalization_accuracy = Stat.of(
            summary_values(answered, "length_generalization_accuracy")
        )
        rows.append(row)
    train_seq_len = runs[0].config["train.seq_len"]
    group = Group(name, title, setting, train_seq_len, lengths, rows)
    group.tokenizers = sorted(set(tokenizers.values()))
    group.problem_lengths = problem_lengths(runs[0])
    mark_other_precision(group, runs)
    if group.problem_lengths is None:
        mark_not_comparable(group)
    else:
        group.task = runs[0].config.get("data.name")
        records = [r for run in runs for r in run.results["eval"]]
        past = [n for n in lengths if n > group.problem_lengths[1]]
        recorded = baselines_over(records, past)
        group.chance_accuracy = recorded["chance_accuracy"]
        if group.chance_accuracy is None:
            group.chance_accuracy = runs[0].results.get("data", {}).get("chance_accuracy")
        group.constant_answer_accuracy = recorded["constant_answer_accuracy"]
        if group.constant_answer_accuracy is None:
            group.constant_answer_accuracy = constant_answer_past(runs[0], past)
        group.prefix_rule_accuracy = recorded["prefix_rule_accuracy"]
        group.teacher_forced = teacher_forced
    with_positions = [
        (key, length)
        for key, by_length in table.items()
        for length, measured in by_length.items()
        if any("loss_by_position" in r for _, r in measured)
    ]
    if with_positions:
        group.position_length = max(length for _, length in with_positions)
        for key, row in zip(sorted_keys, rows, strict=True):
            measured = alike(table[key].get(group.position_length, []))
            row.by_position = position_curve(measured, train_seq_len)
    with_depths = [
        length
        for by_length in table.values()
        for length, measured in by_length.items()
        if any("accuracy_by_depth" in r for _, r in measured)
    ]
    if with_depths:
        group.depth_length = max(with_depths)
        for key, row in zip(sorted_keys, rows, strict=True):
            row.by_depth = depth_accuracy(alike(table[key].get(group.depth_length, [])))
    return group


def constant_answer_past(run: Run, past: Sequence[int]) -> float | None:
    """The constant answer of ``run``'s task at each of the lengths ``past`` its training range
    (Task.constant_answer_accuracy of that length alone: one answer per length, which a model
    that sees the prompt's length can give), averaged; for runs whose records do not hold it.
    None: no such length, or a config that no longer builds the task (a run of an older
    posbench)."""
    if run.config.get("data.source") not in TASKS:
        return None
    try:
        task = load_data(saved_config(run.path).data)
    except PosbenchError:
        return None
    scored = [n for n in past if task.unscorable(n) is None]
    if not scored:
        return None
    return statistics.fmean(task.constant_answer_accuracy([n]) for n in scored)


def sink_rates(results: Sequence[dict[str, Any]]) -> dict[tuple[int, float, int], Stat]:
    """The runs' sink rates (results.json's ``sink``, written by posbench diagnose) over runs,
    by (length, eps, k)."""
    rates: dict[tuple[int, float, int], list[float]] = defaultdict(list)
    for result in results:
        for r in result.get("sink", []):
            rates[(r["length"], r["sink_epsilon"], r["sink_token"])].append(r["sink_rate"])
    return {setting: Stat.of(values) for setting, values in sorted(rates.items())}


def summary_values(results: Sequence[dict[str, Any]], key: str) -> list[float]:
    """The runs' top-level ``key`` where they have one (an algorithmic task's summary)."""
    return [r[key] for r in results if r.get(key) is not None]


def own_answers(results: dict[str, Any]) -> bool:
    """Whether a run's task records score the model's own answers (written at placeholders, or
    decoded greedily: runs.headline_accuracy); those from before eval.decode existed, and
    eval.decode=teacher_forced's, score autoregressive answers under teacher forcing only."""
    return any(decode_mode(e) != "teacher_forced" for e in results["eval"])


def teacher_forced_scores(results: Sequence[dict[str, Any]]) -> bool:
    """Whether none of the runs' records score the model's own answers (``own_answers``):
    their length_generalization_accuracy, where they have one, is teacher-forced."""
    return not any(own_answers(r) for r in results)


def mark_not_comparable(group: Group) -> None:
    """Mark every row of an encoding whose model did not learn comparably: its plain (as
    trained: non-overlapping, unscaled) mean perplexity at the training length is more than
    COMPARABLE_PPL times the best encoding's on its tokenizer (a token of one tokenizer is not
    one of another). Its ratios, flat from a high start, are no sign of extrapolating. Nothing
    without plain records at that length."""
    if group.train_seq_len not in group.lengths:
        return
    column = group.lengths.index(group.train_seq_len)
    trained = {
        row.encoding: (row.tokenizer, row.cells[column].ppl.mean)
        for row in group.rows
        if row.as_trained and row.cells[column].ppl.n
    }
    best_of: dict[str, tuple[float, str]] = {}  # tokenizer -> (best mean, its encoding)
    for encoding, (tokenizer, mean) in trained.items():
        best_of[tokenizer] = min(best_of.get(tokenizer, (mean, encoding)), (mean, encoding))
    for row in group.rows:
        if row.encoding not in trained:
            continue
        tokenizer, mean = trained[row.encoding]
        best_mean, best = best_of[tokenizer]
        if mean > COMPARABLE_PPL * best_mean:
            row.not_comparable = (
                f"did not learn comparably at the training length (ppl {mean:.2f} at "
                f"{group.train_seq_len}, more than {COMPARABLE_PPL:g}× the best encoding's, "
                f"{best}: {best_mean:.2f}): its ratios say little about extrapolation"
            )


def mark_other_precision(group: Group, runs: Sequence[Run]) -> None:
    """Mark every row with a run trained at another precision than most of the group's runs.
    ``train.precision=auto`` resolves per machine (bf16 where the CPU has a bf16 unit, fp32 on
    one without: docs/scaling.md), so sweeps added from another machine can differ under one
    config; their rows compare with the rest only up to what the precision changes. A run from
    before results.json recorded its precision counts as neither."""
    precision = {run.path: run.results.get("precision") for run in runs}
    counts = Counter(p for p in precision.values() if p is not None)
    if len(counts) < 2:
        return
    most = min(counts, key=lambda p: (-counts[p], p))  # a tie: the first by name
    for row in group.rows:
        other = [precision[p] for p in row.runs if precision[p] not in (most, None)]
        if other:
            row.other_precision = (
                f"{len(other)} of its {len(row.runs)} runs trained in "
                f"{' and '.join(sorted(set(other)))}, the table's others in {most} "
                "(train.precision=auto resolves per machine: results.json's precision)"
            )


def has_accuracy(group: Group) -> bool:
    """Whether the group's runs are of a task (their records score answers)."""
    return any(c.sequence_accuracy.n for row in group.rows for c in row.cells)


def build_report(
    dirs: Path | Sequence[Path],
    out: Path | None = None,
    metric: str | None = None,
    reference: Reference | None = None,
    success_threshold: float = DEFAULT_SUCCESS_THRESHOLD,
    effective_threshold: float = DEFAULT_EFFECTIVE_THRESHOLD,
) -> Report:
    """Read every run below ``dirs`` (one directory or several: e.g. a sweep and the sweep
    that added a row to it), a run repeated counted once, and aggregate its ``metric``
    (METRICS; by default ppl, or bits_per_byte for runs on several tokenizers), each group beside
    ``reference``'s table of its training length if it has one, an algorithmic task's seeds
    counted as succeeding above ``success_threshold``, a length effective while its score
    keeps ``effective_threshold`` of the training length's; a one-line error if no run
    finished."""
    if metric is not None and metric not in METRICS:
        raise PosbenchError(f"--metric must be one of {', '.join(METRICS)} (got {metric!r})")
    if not 0 <= success_threshold < 1:
        raise PosbenchError(
            f"--success-threshold must be in [0, 1) (got {success_threshold}): a seed succeeds "
            "with a score above it"
        )
    if not 0 < effective_threshold <= 1:
        raise PosbenchError(
            f"--effective-threshold must be in (0, 1] (got {effective_threshold}): the share of "
            "its score at the training length a length keeps to count as effective"
        )
    if reference is not None and reference.metric not in METRICS:
        raise PosbenchError(
            f"reference {reference.name}'s metric must be one of {', '.join(METRICS)} "
            f"(got {reference.metric!r})"
        )
    dirs = [Path(dirs)] if isinstance(dirs, (str, os.PathLike)) else [Path(d) for d in dirs]
    for directory in dirs:
        if not directory.is_dir() and not is_summary(directory):
            raise PosbenchError(
                f"{directory} is neither a directory nor a summary file; pass a multirun or "
                "outputs directory, or a summary (results/<experiment>/<name>.json)"
            )
    runs, excluded = find_runs(dirs, skip=out)
    if not runs:
        searched = ", ".join(str(d) for d in dirs)
        found = f"{len(excluded)} unfinished" if excluded else "no"
        raise PosbenchError(
            f"no finished run under {searched} ({found} run directories); point at a "
            "directory made by `posbench train` once a run has finished"
        )
    return report_of(
        runs, excluded, dirs, metric, reference, success_threshold, effective_threshold
    )


def report_of(
    runs: Sequence[Run],
    excluded: list[Excluded],
    dirs: list[Path],
    metric: str | None = None,
    reference: Reference | None = None,
    success_threshold: float = DEFAULT_SUCCESS_THRESHOLD,
    effective_threshold: float = DEFAULT_EFFECTIVE_THRESHOLD,
) -> Report:
    """build_report of ``runs`` already read from ``dirs`` (``excluded``: those left out)."""
    runs, duplicates = drop_duplicates(runs)
    tokenizers = sorted({tokenizer_text(run) for run in runs})
    metric, metric_note = chosen_metric(metric, tokenizers)
    by_setting: dict[tuple, list[Run]] = defaultdict(list)
    by_tokenizer = metric == "ppl" and len(tokenizers) > 1
    for run, setting in zip(runs, group_settings(runs, by_tokenizer), strict=True):
        by_setting[setting].append(run)
    settings = sorted(by_setting)
    differing = {k for s in settings for k, v in s if any((k, v) not in t for t in settings)}
    distinct = [{k: json.loads(v) for k, v in s if k in differing} for s in settings]
    if len(settings) > 1:
        titles = group_titles(distinct)
    else:
        titles = [group_title(by_setting[settings[0]][0].config)]
    groups = []
    for number, setting in enumerate(settings, start=1):
        name = f"group{number}" if len(settings) > 1 else ""
        members, title = by_setting[setting], titles[number - 1]
        group = build_group(members, name, title, distinct[number - 1], metric, effective_threshold)
        if reference is not None:
            group.reference = reference.table(group.train_seq_len)
        groups.append(group)
    root = dirs[0] if len(dirs) == 1 else Path(os.path.commonpath([d.absolute() for d in dirs]))
    code = runs_by_code(runs)
    report = Report(root, dirs, groups, excluded, metric, reference, code, success_threshold)
    report.duplicates, report.metric_note = duplicates, metric_note
    report.effective_threshold = effective_threshold
    return report


def runs_by_code(runs: Sequence[Run]) -> list[tuple[dict[str, Any] | None, int]]:
    """Each distinct code that computed ``runs``' results: results.json's ``versions`` (the
    training's; None for runs written before posbench recorded it) and those of the records
    ``posbench eval`` added, with how many runs hold results of each, most first."""
    counts: Counter[str] = Counter()
    for run in runs:
        records = run.results.get("eval", [])
        ran = [run.results.get("versions")] + [r["versions"] for r in records if "versions" in r]
        counts.update({json.dumps(versions, sort_keys=True) for versions in ran})
    return [(json.loads(key), n) for key, n in counts.most_common()]
