"""``posbench report DIR``: a sweep's answer - which encoding extrapolates, by how much, with
what spread over seeds.

Every run below DIR (a directory holding results.json, config.yaml or Hydra's .hydra/) is
read; runs that differ only in their seed are averaged, and runs whose training setting
differs (model, data, train.*) are reported in separate groups, never averaged together.
Written to DIR/report/ (or --out):

    report.md                    the tables (also printed)
    report.csv, report.json      the same numbers, one row per (group, row, length)
    ppl_vs_length[_<group>].png  perplexity against evaluation length, one line per row
    accuracy_vs_length[_<group>].png  a task's answer accuracy against evaluation length
    loss_by_position[_<group>].png  NLL against position in the window at the longest length
    tensorboard/[<group>/]<row>/ the mean curves as TensorBoard runs that overlay in Scalars
                                 (report/ppl, report/ppl_ratio, report/loss_by_position,
                                 report/accuracy)

A ratio is each run's perplexity over its own at the training length measured the same way
(runs.eval_protocol). An encoding whose perplexity there is more than COMPARABLE_PPL times the
best encoding's did not learn comparably: its rows are marked, their ratios saying little.

Loss by position is reported at the longest length whose records hold it: the mean NLL per
position bucket over seeds, and per run "nll after / before" = the token-weighted mean NLL of
the buckets at positions >= train.seq_len over that of the buckets below it.

For a corpus with documents, the documents scored at each length are shown under the
perplexity table (a document shorter than L + 1 bytes is skipped at L, so lengths can score
different text).
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import statistics
import textwrap
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from omegaconf import OmegaConf
from torch.utils.tensorboard import SummaryWriter

from posbench.atomic import atomic_path, atomic_write, replace_directory, write_json
from posbench.config import flat_config
from posbench.errors import PosbenchError
from posbench.runs import (
    CONFIG_FILE,
    RESULTS_FILE,
    eval_protocol,
    positions_mode,
    protocol_text,
    read_results,
    scaling_name,
    training_length_ppl,
)
from posbench.tables import no_reference, ratio_title

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Keys that do not change the trained model, so runs differing only in them are averaged.
# Seed is what is averaged over; encoding makes the rows; eval records are per length anyway.
NOT_A_SETTING = (
    "seed",
    "encoding",
    "device",
    "threads",
    "eval",
    "data.cache_dir",
    "train.log_every",
    "train.val_every",
    "train.val_batches",
    "train.checkpoint_every",
    "train.resume",
)
FIGURE_INCHES = (8.0, 5.0)
FIGURE_DPI = 100  # with FIGURE_INCHES: 800 x 500 pixels
TITLE_CHARACTERS = 100  # per line of a figure's title (a group's full setting can be longer)
MISSING_RESULTS = "no results.json (failed, interrupted or still running)"
# An encoding whose mean perplexity at the training length is more than this many times the
# best encoding's did not learn comparably (e.g. under-trained): a flat ratio from a high start
# says nothing about extrapolating.
COMPARABLE_PPL = 1.5


@dataclass(frozen=True)
class Run:
    path: Path
    config: dict[str, Any]  # flat: {"train.seq_len": 128, ...}
    results: dict[str, Any]


@dataclass(frozen=True)
class Excluded:
    path: Path
    reason: str


@dataclass(frozen=True)
class Stat:
    """Mean and sample standard deviation (n - 1) of ``n`` values; ``std`` is None below 2."""

    n: int
    mean: float | None
    std: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> Stat:
        if not values:
            return cls(0, None, None)
        std = statistics.stdev(values) if len(values) > 1 else None
        return cls(len(values), statistics.fmean(values), std)


@dataclass(frozen=True)
class Cell:
    length: int
    ppl: Stat
    ratio: Stat  # ppl(length) / ppl(train length) of the same protocol, per run
    unsupported: str | None  # the reason, when no run could measure this length
    accuracy: Stat = Stat(0, None, None)  # a task's answer bytes right, per run
    sequence_accuracy: Stat = Stat(0, None, None)  # a task's examples right in full, per run
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


@dataclass
class Report:
    root: Path
    groups: list[Group]
    excluded: list[Excluded]


# ----------------------------------------------------------------------------- reading


def find_runs(root: Path, skip: Path | None = None) -> tuple[list[Run], list[Excluded]]:
    """Every run directory below ``root`` (not descending into runs, hidden directories or
    ``skip``), split into runs to report and runs excluded with the reason."""
    runs, excluded = [], []
    for directory, subdirs, files in os.walk(root):
        path = Path(directory)
        if skip is not None and path.resolve() == skip.resolve():
            subdirs.clear()
            continue
        subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
        if RESULTS_FILE in files or CONFIG_FILE in files or (path / ".hydra").is_dir():
            subdirs.clear()
            run = read_run(path)
            (runs if isinstance(run, Run) else excluded).append(run)
    return runs, excluded


def read_run(path: Path) -> Run | Excluded:
    try:
        results = read_results(path)
    except PosbenchError as err:
        return Excluded(path, str(err))
    if not results:
        return Excluded(path, MISSING_RESULTS)
    status = results.get("status") or "ok"  # results.json before issue 5 has no status
    if status != "ok":
        step = results.get("train", {}).get("diverged_at_step")
        return Excluded(path, status + (f" at step {step}" if step is not None else ""))
    if "eval" not in results:
        return Excluded(path, f"{RESULTS_FILE} holds no evaluation records")
    if not (path / CONFIG_FILE).is_file():
        return Excluded(path, f"no {CONFIG_FILE}: not a posbench run")
    return Run(path, flat_config(OmegaConf.load(path / CONFIG_FILE)), results)


# ----------------------------------------------------------------------------- numbers


def training_setting(run: Run) -> tuple[tuple[str, str], ...]:
    """What the trained model depends on besides encoding and seed, hashable."""
    return tuple(
        (key, json.dumps(value))
        for key, value in sorted(run.config.items())
        if not any(key == k or key.startswith(f"{k}.") for k in NOT_A_SETTING)
    )


def encoding_labels(runs: Sequence[Run]) -> dict[Path, str]:
    """Each run's encoding name, plus the encoding options that differ between runs of that
    name (so rope with two bases makes two rows instead of one average)."""
    options = {
        run.path: {k: v for k, v in run.config.items() if k.startswith("encoding.")} for run in runs
    }
    labels = {}
    for run in runs:
        name = run.config["encoding.name"]
        same_name = [options[r.path] for r in runs if r.config["encoding.name"] == name]
        differing = sorted(
            k for k in options[run.path] if len({json.dumps(o.get(k)) for o in same_name}) > 1
        )
        details = ", ".join(
            f"{k.removeprefix('encoding.')}={options[run.path][k]}" for k in differing
        )
        labels[run.path] = f"{name} ({details})" if details else name
    return labels


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


def reference_ppl(run: Run, record: dict[str, Any]) -> float | None:
    """The run's perplexity at its training length measured as ``record`` was (the same
    ``eval_protocol``): what ``record``'s ratio divides by."""
    references = training_length_ppl(run.results["eval"], run.config["train.seq_len"])
    return references.get(eval_protocol(record))


def build_group(runs: Sequence[Run], name: str, title: str, setting: dict[str, Any]) -> Group:
    labels = encoding_labels(runs)
    # (label, scaling name, stride, other positions) -> length -> the runs' records there
    table: dict[tuple, dict[int, list[tuple[Run, dict]]]] = defaultdict(lambda: defaultdict(list))
    row_runs: dict[tuple, list[Path]] = defaultdict(list)
    for run in runs:
        for record in run.results["eval"]:
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
    rows = []
    sorted_keys = sorted(table, key=lambda k: (k[0], k[1] != "none", k[1], k[2] or 0, k[3] or ""))
    for key in sorted_keys:
        label, scaling, stride, positions = key
        shown = row_label(label, scaling, stride, positions)
        row = Row(shown, label, scaling, stride, positions, row_runs[key])
        row.cells = [cell(length, table[key].get(length, [])) for length in lengths]
        rows.append(row)
    train_seq_len = runs[0].config["train.seq_len"]
    group = Group(name, title, setting, train_seq_len, lengths, rows)
    mark_not_comparable(group)
    with_positions = [
        (key, length)
        for key, by_length in table.items()
        for length, measured in by_length.items()
        if any("loss_by_position" in r for _, r in measured)
    ]
    if with_positions:
        group.position_length = max(length for _, length in with_positions)
        for key, row in zip(sorted_keys, rows, strict=True):
            measured = table[key].get(group.position_length, [])
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
            row.by_depth = depth_accuracy(table[key].get(group.depth_length, []))
    return group


def depth_accuracy(measured: Sequence[tuple[Run, dict]]) -> dict[int, Stat] | None:
    """The runs' passkey accuracy at each needle depth, over runs; None when none has one."""
    per_depth: dict[int, list[float]] = defaultdict(list)
    for _, record in measured:
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


def cell(length: int, measured: Sequence[tuple[Run, dict]]) -> Cell:
    ok_records = [(run, r) for run, r in measured if r["status"] == "ok"]
    ok = [(run, r["ppl"]) for run, r in ok_records]
    ratios = [r["ppl"] / ref for run, r in ok_records if (ref := reference_ppl(run, r)) is not None]
    missing = {}
    if ok and not ratios:  # measured, but no run measured the training length that way
        run, record = ok_records[0]
        missing["ratio"] = no_reference(run.config["train.seq_len"], protocol_text(record))
    reasons = sorted({r["reason"] for _, r in measured if r["status"] != "ok"})
    unsupported = "; ".join(reasons) if reasons and not ok else None
    scored = [r for _, r in measured if r.get("accuracy") is not None]
    documents = {count for _, r in ok_records if (count := r.get("documents")) is not None}
    return Cell(
        length,
        Stat.of([ppl for _, ppl in ok]),
        Stat.of(ratios),
        unsupported,
        Stat.of([r["accuracy"] for r in scored]),
        Stat.of([r["sequence_accuracy"] for r in scored]),
        tuple(sorted(documents)),
        missing,
    )


def mark_not_comparable(group: Group) -> None:
    """Mark every row of an encoding whose model did not learn comparably: its plain (as
    trained: non-overlapping, unscaled) mean perplexity at the training length is more than
    COMPARABLE_PPL times the best encoding's. Its ratios, flat from a high start, are no sign
    of extrapolating. Nothing without plain records at that length."""
    if group.train_seq_len not in group.lengths:
        return
    column = group.lengths.index(group.train_seq_len)
    trained = {
        row.encoding: row.cells[column].ppl.mean
        for row in group.rows
        if row.scaling == "none"
        and row.stride is None
        and row.positions is None
        and row.cells[column].ppl.n
    }
    if not trained:
        return
    best = min(trained, key=trained.__getitem__)
    for row in group.rows:
        mean = trained.get(row.encoding)
        if mean is not None and mean > COMPARABLE_PPL * trained[best]:
            row.not_comparable = (
                f"did not learn comparably at the training length (ppl {mean:.2f} at "
                f"{group.train_seq_len}, more than {COMPARABLE_PPL:g}× the best encoding's, "
                f"{best}: {trained[best]:.2f}): its ratios say little about extrapolation"
            )


def has_accuracy(group: Group) -> bool:
    """Whether the group's runs are of a task (their records score answers)."""
    return any(c.accuracy.n for row in group.rows for c in row.cells)


def group_title(config: dict[str, Any]) -> str:
    return (
        f"{config.get('data.name', '?')} data, model {config['model.n_layer']}×"
        f"{config['model.d_model']}, trained at {config['train.seq_len']} tokens for "
        f"{config['train.steps']} steps"
    )


def build_report(root: Path, out: Path | None = None) -> Report:
    """Read every run below ``root`` and aggregate it; a one-line error if none finished."""
    root = Path(root)
    if not root.is_dir():
        raise PosbenchError(f"{root} is not a directory; pass a multirun or outputs directory")
    runs, excluded = find_runs(root, skip=out)
    if not runs:
        found = f"{len(excluded)} unfinished" if excluded else "no"
        raise PosbenchError(
            f"no finished run under {root} ({found} run directories); point at a directory "
            "made by `posbench train` once a run has finished"
        )
    by_setting: dict[tuple, list[Run]] = defaultdict(list)
    for run in runs:
        by_setting[training_setting(run)].append(run)
    settings = sorted(by_setting)
    differing = sorted(
        {k for s in settings for k, v in s if any((k, v) not in t for t in settings)}
    )
    groups = []
    for number, setting in enumerate(settings, start=1):
        members = by_setting[setting]
        distinct = {k: members[0].config[k] for k in differing if k in members[0].config}
        title = group_title(members[0].config)
        if distinct:
            title += "; " + ", ".join(f"{k}={v}" for k, v in distinct.items())
        name = f"group{number}" if len(settings) > 1 else ""
        groups.append(build_group(members, name, title, distinct))
    return Report(root, groups, excluded)


# ----------------------------------------------------------------------------- Markdown


def multiple(length: int, train_seq_len: int) -> str:
    return f"{length / train_seq_len:g}×"


def stat_text(stat: Stat, bold: bool = False) -> str:
    mean = f"**{stat.mean:.2f}**" if bold else f"{stat.mean:.2f}"
    return mean if stat.std is None else f"{mean} ± {stat.std:.2f}"


def length_headers(group: Group) -> list[str]:
    return [f"{length} ({multiple(length, group.train_seq_len)})" for length in group.lengths]


def documents_note(group: Group) -> list[str]:
    """How many documents each length scored, for a corpus with documents (nothing for one
    stream): a document shorter than L + 1 bytes is skipped at L, so lengths can differ."""
    counts = [
        sorted({n for row in group.rows for n in row.cells[i].documents})
        for i in range(len(group.lengths))
    ]
    if not any(counts):
        return []
    texts = [", ".join(str(n) for n in c) or "–" for c in counts]
    if len(set(texts)) == 1:
        return [f"Documents scored: {texts[0]} at every length."]
    return [
        "Documents scored at each length (a document shorter than L + 1 bytes is skipped at L: "
        "these lengths score different documents):",
        "",
        "| | " + " | ".join(length_headers(group)) + " |",
        "| --- |" + " --- |" * len(group.lengths),
        "| documents | " + " | ".join(texts) + " |",
    ]


def markdown_table(
    group: Group, metric: str, footnotes: dict[str, int], best_of: Any = min
) -> list[str]:
    """``metric`` a Cell's Stat ("ppl", "ratio", "accuracy", ...): one line per row, one column
    per length; the best mean per column (``best_of`` the means: min, or max for accuracies)
    in bold; unsupported cells, measured cells without that metric and rows that are not
    comparable point to a footnote with the reason."""
    lines = [
        "| encoding | runs | " + " | ".join(length_headers(group)) + " |",
        "| --- | --- |" + " --- |" * len(group.lengths),
    ]
    best = {}
    for i in range(len(group.lengths)):
        means = [getattr(row.cells[i], metric).mean for row in group.rows]
        measured = [m for m in means if m is not None]
        best[i] = best_of(measured) if len(measured) > 1 else None
    for row in group.rows:
        texts = []
        for i, c in enumerate(row.cells):
            stat = getattr(c, metric)
            if c.unsupported is not None:
                texts.append(f"unsupported [{footnote(footnotes, row.encoding, c.unsupported)}]")
            elif metric in c.missing:
                texts.append(f"– [{footnote(footnotes, row.label, c.missing[metric])}]")
            elif stat.mean is None:
                texts.append("–")
            else:
                text = stat_text(stat, bold=stat.mean == best[i])
                texts.append(text if stat.n == len(row.runs) else f"{text} (n={stat.n})")
        lines.append(
            f"| {row_name(row, footnotes)} | {len(row.runs)} | " + " | ".join(texts) + " |"
        )
    return lines


def footnote(footnotes: dict[str, int], subject: str, why: str) -> int:
    """The number of the footnote "subject: why", a new one the first time it is needed."""
    return footnotes.setdefault(f"{subject}: {why}", len(footnotes) + 1)


def row_name(row: Row, footnotes: dict[str, int]) -> str:
    """A row's label in a table, pointing to the footnote that says why when it is not
    comparable (one footnote for all rows of an encoding)."""
    if row.not_comparable is None:
        return row.label
    return f"{row.label} [{footnote(footnotes, row.encoding, row.not_comparable)}]"


def position_table(group: Group, footnotes: dict[str, int]) -> list[str]:
    """Where in the window the loss rises, at the group's longest length with loss by
    position: each row's NLL before and from the training length, and their ratio."""
    S, length = group.train_seq_len, group.position_length
    lines = [
        f"Loss by position at {length} tokens ({multiple(length, S)}): mean NLL (nats per "
        f"token) at positions < {S} (before the training length) and >= {S} (after), "
        "token-weighted over the position buckets, and after / before per run:",
        "",
        "| encoding | runs | nll before | nll after | nll after / before |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in group.rows:
        curve = row.by_position
        if curve is not None:
            stats = (curve.before, curve.after, curve.ratio)
            texts = ["–" if stat.mean is None else stat_text(stat) for stat in stats]
            lines.append(
                f"| {row_name(row, footnotes)} | {curve.before.n} | " + " | ".join(texts) + " |"
            )
    return lines


ACCURACIES = {
    "accuracy": "Accuracy (answer bytes predicted right, argmax under teacher forcing)",
    "sequence_accuracy": "Sequence accuracy (examples whose whole answer is right)",
}


def depth_table(group: Group, footnotes: dict[str, int]) -> list[str]:
    """Passkey accuracy per depth of the needle at the group's ``depth_length``."""
    depths = sorted({d for row in group.rows if row.by_depth for d in row.by_depth})
    length = group.depth_length
    lines = [
        f"Accuracy by depth of the pass key in the filler, at {length} tokens "
        f"({multiple(length, group.train_seq_len)}; 0 % = first, 100 % = just before the "
        "question):",
        "",
        "| encoding | runs | " + " | ".join(f"{d} %" for d in depths) + " |",
        "| --- | --- |" + " --- |" * len(depths),
    ]
    for row in group.rows:
        if row.by_depth:
            texts = [stat_text(row.by_depth[d]) if d in row.by_depth else "–" for d in depths]
            n = max(stat.n for stat in row.by_depth.values())
            lines.append(f"| {row_name(row, footnotes)} | {n} | " + " | ".join(texts) + " |")
    return lines


def markdown(report: Report) -> str:
    n_runs = sum(len({p for row in g.rows for p in row.runs}) for g in report.groups)
    lines = [
        f"# posbench report: {report.root}",
        "",
        f"{n_runs} runs. Cells: mean ± sample standard deviation (n − 1) over the runs (seeds) "
        "of a row; a single run shows its value alone, (n=k) marks a cell fewer runs "
        "measured. Best mean per column in bold (lowest perplexity, highest accuracy).",
    ]
    footnotes: dict[str, int] = {}
    for group in report.groups:
        lines += ["", f"## {group.title}", "", "Perplexity:", ""]
        lines += markdown_table(group, "ppl", footnotes)
        if note := documents_note(group):
            lines += ["", *note]
        lines += ["", f"{ratio_title(group.train_seq_len)}, each run against its own:", ""]
        lines += markdown_table(group, "ratio", footnotes)
        if has_accuracy(group):
            for metric, what in ACCURACIES.items():
                lines += ["", f"{what}:", ""]
                lines += markdown_table(group, metric, footnotes, best_of=max)
        if group.depth_length is not None:
            lines += ["", *depth_table(group, footnotes)]
        if group.position_length is not None:
            lines += ["", *position_table(group, footnotes)]
    if footnotes:
        lines += [""] + [f"- [{n}] {text}" for text, n in footnotes.items()]
    if report.excluded:
        lines += ["", "Excluded runs (not in the means):", ""]
        lines += [f"- `{relative(e.path, report.root)}`: {e.reason}" for e in report.excluded]
    return "\n".join(lines) + "\n"


def relative(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path != root else "."


# ----------------------------------------------------------------------------- CSV / JSON

CSV_FIELDS = [
    "group",
    "encoding",
    "scaling",
    "stride",
    "positions",
    "runs",
    "comparable",
    "length",
    "multiple",
    "status",
    "reason",
    "ppl_n",
    "ppl_mean",
    "ppl_std",
    "ratio_n",
    "ratio_mean",
    "ratio_std",
    "accuracy_n",
    "accuracy_mean",
    "accuracy_std",
    "sequence_accuracy_n",
    "sequence_accuracy_mean",
    "sequence_accuracy_std",
    "documents_min",
    "documents_max",
]


def cell_records(report: Report) -> list[dict[str, Any]]:
    """One flat record per (group, row, length): the rows of report.csv and report.json."""
    return [
        {
            "group": group.name,
            "encoding": row.label,
            "scaling": row.scaling,
            "stride": row.stride,
            "positions": row.positions,
            "runs": len(row.runs),
            "comparable": row.not_comparable is None,
            "length": c.length,
            "multiple": c.length / group.train_seq_len,
            "status": "unsupported"
            if c.unsupported is not None
            else "ok"
            if c.ppl.n
            else "missing",
            "reason": c.unsupported,
            "ppl_n": c.ppl.n,
            "ppl_mean": c.ppl.mean,
            "ppl_std": c.ppl.std,
            "ratio_n": c.ratio.n,
            "ratio_mean": c.ratio.mean,
            "ratio_std": c.ratio.std,
            **{
                f"{metric}_{part}": getattr(getattr(c, metric), part)
                for metric in ACCURACIES
                for part in ("n", "mean", "std")
            },
            "documents_min": min(c.documents, default=None),
            "documents_max": max(c.documents, default=None),
        }
        for group in report.groups
        for row in group.rows
        for c in row.cells
    ]


def csv_text(records: Sequence[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(records)
    return buffer.getvalue()


def json_content(report: Report, records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {
        "root": str(report.root),
        "std": "sample standard deviation (n - 1) over runs; null for a single run",
        "groups": [
            {
                "name": g.name,
                "title": g.title,
                "setting": g.setting,
                "train_seq_len": g.train_seq_len,
                "rows": {row.label: [relative(p, report.root) for p in row.runs] for row in g.rows},
                "loss_by_position": position_content(g),
                "accuracy_by_depth": depth_content(g),
            }
            for g in report.groups
        ],
        "cells": list(records),
        "excluded": [
            {"path": relative(e.path, report.root), "reason": e.reason} for e in report.excluded
        ],
    }


def depth_content(group: Group) -> dict[str, Any] | None:
    """The group's passkey accuracy per needle depth, for report.json."""
    if group.depth_length is None:
        return None
    rows = {
        row.label: {
            "depth_percent": list(row.by_depth),
            **{
                f"accuracy_{part}": [getattr(stat, part) for stat in row.by_depth.values()]
                for part in ("n", "mean", "std")
            },
        }
        for row in group.rows
        if row.by_depth
    }
    return {"length": group.depth_length, "rows": rows}


def position_content(group: Group) -> dict[str, Any] | None:
    """The group's loss-by-position curves and before/after split, for report.json."""
    if group.position_length is None:
        return None
    rows = {}
    for row in group.rows:
        curve = row.by_position
        if curve is not None:
            rows[row.label] = {
                "start": [start for start, _ in curve.buckets],
                "end": [end for _, end in curve.buckets],
                "nll_n": [stat.n for stat in curve.nll],
                "nll_mean": [stat.mean for stat in curve.nll],
                "nll_std": [stat.std for stat in curve.nll],
                **{
                    f"{name}_{part}": getattr(getattr(curve, name), part)
                    for name in ("before", "after", "ratio")
                    for part in ("n", "mean", "std")
                },
            }
    return {"length": group.position_length, "rows": rows}


# ----------------------------------------------------------------------------- plot

# matplotlib's ten default colours, then the same ten dashed, dash-dotted and dotted: a sweep
# with more than ten rows (every encoding plus scaled re-evaluations) keeps every line distinct.
LINE_STYLES = ("-", "--", "-.", ":")


def row_style(index: int) -> dict[str, str]:
    """The colour and line style of a group's ``index``-th row, the same in every figure."""
    return {"color": f"C{index % 10}", "linestyle": LINE_STYLES[index // 10 % len(LINE_STYLES)]}


def legend_label(row: Row) -> str:
    """A row's label in a figure's legend, marked when the row is not comparable."""
    return row.label if row.not_comparable is None else f"{row.label} (not comparable)"


def ppl_figure(group: Group) -> Figure:
    """Mean perplexity against evaluation length (log-log), ± one std shaded, one line per
    row; a fixed FIGURE_INCHES x FIGURE_DPI canvas so every report image has the same size."""
    from matplotlib.ticker import StrMethodFormatter  # lazily: only commands that draw

    figure, axes = length_figure(group, "ppl")
    axes.set_yscale("log")
    axes.yaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
    axes.yaxis.set_minor_formatter(StrMethodFormatter("{x:g}"))
    axes.set_ylabel("perplexity (mean ± std over seeds)")
    figure.tight_layout()  # arranges the axes inside the fixed canvas; the size stays
    return figure


def accuracy_figure(group: Group) -> Figure:
    """A task's mean accuracy on the answer bytes against evaluation length, as ppl_figure."""
    figure, axes = length_figure(group, "accuracy")
    axes.set_ylim(0, 1)
    axes.set_ylabel("accuracy on the answer bytes (mean ± std over seeds)")
    figure.tight_layout()
    return figure


def length_figure(group: Group, metric: str) -> tuple[Figure, Any]:
    """The cells' ``metric`` Stat against evaluation length (log x), ± one std shaded, one
    line per row, the training length marked; the caller labels the y axis."""
    # matplotlib takes a second to import: only commands that draw pay for it
    from matplotlib.figure import Figure

    figure = Figure(figsize=FIGURE_INCHES, dpi=FIGURE_DPI)
    axes = figure.add_subplot()
    for index, row in enumerate(group.rows):
        stats = [(c.length, getattr(c, metric)) for c in row.cells]
        points = [(length, stat.mean, stat.std or 0.0) for length, stat in stats if stat.n]
        if not points:
            continue
        lengths, means, stds = (np.array(v) for v in zip(*points, strict=True))
        style = row_style(index)
        axes.plot(lengths, means, marker="o", label=legend_label(row), **style)
        axes.fill_between(lengths, means - stds, means + stds, color=style["color"], alpha=0.2)
    axes.axvline(group.train_seq_len, color="grey", linestyle="--", label="train length")
    axes.set_xscale("log", base=2)
    axes.set_xticks(group.lengths, labels=[str(length) for length in group.lengths])
    axes.set_xlabel("evaluation length (tokens)")
    axes.set_title(textwrap.fill(group.title, TITLE_CHARACTERS), fontsize="small")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize="small")
    return figure, axes


def position_figure(group: Group) -> Figure:
    """Mean NLL against position in the window at the group's ``position_length`` (log x, each
    bucket at its end position), ± one std shaded, one line per row; the training length
    marked. The same canvas as ppl_figure."""
    from matplotlib.figure import Figure  # lazily, as in ppl_figure

    figure = Figure(figsize=FIGURE_INCHES, dpi=FIGURE_DPI)
    axes = figure.add_subplot()
    for index, row in enumerate(group.rows):
        if row.by_position is None:
            continue
        ends = np.array([end for _, end in row.by_position.buckets])
        means = np.array([stat.mean for stat in row.by_position.nll])
        stds = np.array([stat.std or 0.0 for stat in row.by_position.nll])
        style = row_style(index)
        axes.plot(ends, means, marker=".", label=legend_label(row), **style)
        axes.fill_between(ends, means - stds, means + stds, color=style["color"], alpha=0.2)
    axes.axvline(group.train_seq_len, color="grey", linestyle="--", label="train length")
    axes.set_xscale("log", base=2)
    axes.set_xlabel(f"position in the window (bucket end; window {group.position_length} tokens)")
    axes.set_ylabel("NLL, nats per token (mean ± std over seeds)")
    axes.set_title(textwrap.fill(group.title, TITLE_CHARACTERS), fontsize="small")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize="small")
    figure.tight_layout()
    return figure


# ----------------------------------------------------------------------------- writing


def slug(label: str) -> str:
    """A directory name for a row label: "rope + yarn" -> "rope+yarn"."""
    return re.sub(r"[^\w.+=-]+", "_", label.replace(" + ", "+")).strip("_")


def write_tensorboard(report: Report, directory: Path) -> None:
    """One TensorBoard run per row (per group), its mean perplexity at step = length, so the
    rows overlay in the Scalars tab."""
    for group in report.groups:
        for row in group.rows:
            with SummaryWriter(log_dir=str(directory / group.name / slug(row.label))) as writer:
                for c in row.cells:
                    if c.ppl.n:
                        writer.add_scalar("report/ppl", c.ppl.mean, global_step=c.length)
                    if c.ratio.n:
                        writer.add_scalar("report/ppl_ratio", c.ratio.mean, global_step=c.length)
                    if c.accuracy.n:
                        writer.add_scalar("report/accuracy", c.accuracy.mean, global_step=c.length)
                if row.by_position is not None:
                    for (_, end), stat in zip(
                        row.by_position.buckets, row.by_position.nll, strict=True
                    ):
                        writer.add_scalar("report/loss_by_position", stat.mean, global_step=end)


def write_report(report: Report, out: Path) -> list[Path]:
    """Write every output into ``out``, each atomically; return their paths."""
    records = cell_records(report)
    written = [out / "report.md", out / "report.csv", out / "report.json"]
    atomic_write(written[0], markdown(report).encode())
    atomic_write(written[1], csv_text(records).encode())
    write_json(written[2], json_content(report, records))
    for group in report.groups:
        figures = {"ppl_vs_length": ppl_figure(group)}
        if group.position_length is not None:
            figures["loss_by_position"] = position_figure(group)
        if has_accuracy(group):
            figures["accuracy_vs_length"] = accuracy_figure(group)
        for stem, figure in figures.items():
            path = out / f"{stem}{'_' + group.name if group.name else ''}.png"
            with atomic_path(path) as tmp:
                figure.savefig(tmp, format="png", dpi=FIGURE_DPI)
            written.append(path)
    with replace_directory(out / "tensorboard") as tmp:
        write_tensorboard(report, tmp)
    written.append(out / "tensorboard")
    return written
