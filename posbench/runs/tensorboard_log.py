"""What posbench writes to TensorBoard, in one place so train and eval log alike. The other
loggers (posbench/runs/loggers/) log the same tags, curve points (length_points,
loss_by_position_points) and figure (eval_figure).

The extrapolation curve is a scalar series whose global step is the evaluation length, so
TensorBoard's Scalars tab plots perplexity against length (set its x-axis to "step").
Each series is one way of evaluating: ``eval/ppl`` (plain), ``eval/ppl/<method>`` (eval-time
scaling such as ``yarn``, with s from each length), ``eval/ppl/<method>_s<factor>`` (a
configured factor, e.g. ``yarn_s4``), ``eval/ppl/stride_<S>`` (sliding windows), and
``eval/ppl/<method>/stride_<S>`` for both.

A task's records also go to ``eval/accuracy`` (answer bytes right in the model's own answer:
written at placeholders, or decoded greedily; records scored under teacher forcing have none,
but flip_flop's, whose paper scores its reads so),
``eval/sequence_accuracy`` and ``eval/teacher_forced_accuracy`` (step = length). An
algorithmic task's figure is ``eval/sequence_accuracy_vs_problem_length`` instead: its lengths
are problem lengths, trained over a range (``TrainedLengths``), and its measure is accuracy.

The effective context length (results.effective_context_lengths, at its default threshold) is
one scalar per series, ``eval/effective_context_length`` (suffixed as above), at step 0, and
the HParams metric ``effective_context_length`` (the series measured as the run was trained).

Loss by position is one series per evaluated length, ``eval/loss_by_position/L<length>``
(suffixed with the scaling method when there is one), whose step is each bucket's end position.

The evaluation results live in one event file of their own, ``EVAL_EVENTS_FILE``, rewritten
from all of results.json's records whenever they change (after training, after each
``posbench eval``): a re-evaluated length replaces its point instead of adding a second one,
and the ``eval/ppl_vs_length`` figure always shows every record. The HParams metrics read from
the records (``ppl_at_<length>``, ``accuracy_at_<length>``, the effective context length, an
algorithmic task's length_generalization summaries: record_metrics) are written there too, so
none is left at the training's value after a re-evaluation; and the HParams tab's declaration
of the run's columns, every one of those metrics, is rewritten with them in a file of its own,
``HPARAMS_EVENTS_FILE``, so a length first measured by ``posbench eval`` gets its column.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from omegaconf import DictConfig, OmegaConf
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams as hparams_summaries

from posbench.config import flat_config
from posbench.runs.directory import data_name
from posbench.runs.results import (
    as_trained,
    effective_context_lengths,
    headline_accuracy,
    one_per_measurement,
    scaling_method,
    scaling_setting,
    with_length_generalization,
)
from posbench.system.atomic import atomic_path

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


class TrainedLengths(NamedTuple):
    """Where a run trained, on the length axis of its evaluation records: ``train.seq_len``
    tokens (lo = hi), or an algorithmic task's problem lengths lo..hi (``data.train_lengths``)."""

    lo: int
    hi: int
    problem_lengths: bool = False

    @classmethod
    def tokens(cls, seq_len: int) -> TrainedLengths:
        return cls(seq_len, seq_len)


def trained_lengths(cfg: DictConfig) -> TrainedLengths:
    """Where the run of ``cfg`` trained: an algorithmic task's problem lengths (its config has
    ``data.train_lengths``), else its sequence length."""
    lengths = OmegaConf.select(cfg, "data.train_lengths")
    if lengths is None:
        return TrainedLengths.tokens(cfg.train.seq_len)
    return TrainedLengths(*lengths, problem_lengths=True)


# TensorBoard reads a directory's event files in name order; this name sorts after the
# timestamped ones SummaryWriter makes (digits < letters), so a resumed run's purge of later
# training steps (a SessionLog START) never drops evaluation points, whose step is a length.
EVAL_EVENTS_FILE = "events.out.tfevents.eval"
# The HParams tab's columns are the metrics of the first experiment summary TensorBoard reads in
# a run's directory (it keeps a tag's first metadata): this name sorts before the timestamped
# files, so the declaration rewritten after every evaluation is read, not the training's, which
# declared only the lengths evaluated then. A TensorBoard already watching the run reads a file
# that appears before the ones it has read when restarted.
HPARAMS_EVENTS_FILE = "events.out.tfevents.0.hparams"
HPARAM_PREFIX = "hparam/"  # the HParams tab's metrics, as scalars of these tags


def series_name(record: Mapping[str, Any]) -> str:
    """How a record was measured, as a path: "" (plain), "yarn", "yarn_s4" (factor 4),
    "stride_64", "yarn/stride_64"."""
    parts = []
    if scaling_method(record) != "none":
        setting = scaling_setting(record)
        suffix = "" if setting is None else f"_s{setting:g}"
        parts.append(scaling_method(record) + suffix)
    if record.get("stride") is not None:
        parts.append(f"stride_{record['stride']}")
    return "/".join(parts)


def eval_tag(metric: str, record: Mapping[str, Any]) -> str:
    """``eval/<metric>``, suffixed with the record's series (scaling method, then stride)."""
    series = series_name(record)
    return f"eval/{metric}/{series}" if series else f"eval/{metric}"


class Point(NamedTuple):
    """One point of an evaluation curve: ``value`` of the series ``tag`` at ``x``, the
    evaluation length (for loss by position: the bucket's end position)."""

    tag: str
    x: int
    value: float


def length_points(records: Sequence[Mapping[str, Any]]) -> list[Point]:
    """One point per evaluated length on ``eval/ppl``, ``eval/bits_per_byte``, ``eval/word_ppl``
    (text: the metrics that compare across tokenizers), ``eval/longppl`` (posbench eval --metric
    longppl) and, for a task, ``eval/accuracy`` (of
    the model's own answer), ``eval/sequence_accuracy`` and ``eval/teacher_forced_accuracy`` (an
    algorithmic task's at x = problem length)."""
    points = []
    chosen = {id(r) for r in one_per_measurement(records)}
    for record in records:
        if record["status"] != "ok":
            continue
        values = {
            metric: record.get(metric)
            for metric in ("ppl", "bits_per_byte", "word_ppl", "longppl", "sequence_accuracy")
        }
        values["accuracy"] = headline_accuracy(record)
        values["teacher_forced_accuracy"] = record.get("teacher_forced_accuracy")
        if id(record) not in chosen:  # LongPPL's beside a plain record: its own point only
            values = {"longppl": values["longppl"]}
        for metric, value in values.items():
            if value is not None:  # word_ppl: text only; accuracy: tasks only
                points.append(Point(eval_tag(metric, record), record["length"], value))
    return points


def effective_length_scalars(
    records: Sequence[Mapping[str, Any]], trained: TrainedLengths
) -> dict[str, int]:
    """``eval/effective_context_length`` of each series of ``records`` that has one (none for
    an algorithmic task: its lengths are problem lengths, trained over a range)."""
    if trained.problem_lengths:
        return {}
    return {
        eval_tag("effective_context_length", entry): entry["length"]
        for entry in effective_context_lengths(records, trained.lo)
        if entry["length"] is not None
    }


def loss_by_position_tag(record: Mapping[str, Any]) -> str:
    """``eval/loss_by_position/L<length>``, suffixed with the record's series."""
    series = series_name(record)
    return f"eval/loss_by_position/L{record['length']}" + (f"/{series}" if series else "")


def loss_by_position_points(records: Sequence[Mapping[str, Any]]) -> list[Point]:
    """Each record's bucket NLLs at x = the bucket's end position."""
    return [
        Point(loss_by_position_tag(record), bucket["end"], bucket["nll"])
        for record in records
        for bucket in record.get("loss_by_position", [])
    ]


def eval_figure(
    records: Sequence[Mapping[str, Any]], trained: TrainedLengths
) -> tuple[str, Figure] | None:
    """The run's evaluation at a glance, with its tag: an algorithmic task's sequence accuracy
    by problem length, else perplexity by length; None when nothing was measured."""
    if trained.problem_lengths:
        figure = problem_length_figure(records, trained)
        tag = "eval/sequence_accuracy_vs_problem_length"
    else:
        figure, tag = extrapolation_figure(records, trained.lo), "eval/ppl_vs_length"
    return None if figure is None else (tag, figure)


def log_eval_records(
    writer: SummaryWriter, records: Sequence[Mapping[str, Any]], trained: TrainedLengths
) -> None:
    """``records``'s points (length_points, then loss_by_position_points) with the x as the
    global step, the effective context lengths at step 0, and their figure."""
    for point in [*length_points(records), *loss_by_position_points(records)]:
        writer.add_scalar(point.tag, point.value, global_step=point.x)
    for tag, length in effective_length_scalars(records, trained).items():
        writer.add_scalar(tag, length, global_step=0)
    # The HParams metrics read from the records too: this file sorts after the one log_hparams
    # wrote as the run trained, so a re-evaluation's values are the ones TensorBoard reads (the
    # training's summary, final_loss and val_ppl, stays as it was). Their columns are declared
    # in HPARAMS_EVENTS_FILE (write_hparams_events).
    for name, value in record_metrics(records, trained).items():
        writer.add_scalar(HPARAM_PREFIX + name, value, 0)
    figure = eval_figure(records, trained)
    if figure is not None:
        writer.add_figure(*figure)
    writer.flush()


def write_eval_events(
    run_dir: Path, records: Sequence[Mapping[str, Any]], trained: TrainedLengths
) -> Path:
    """(Re)write ``run_dir/EVAL_EVENTS_FILE`` from ``records``, all of the run's eval records,
    atomically: TensorBoard then shows exactly what results.json holds."""
    path = Path(run_dir) / EVAL_EVENTS_FILE
    return rewrite_events(path, lambda writer: log_eval_records(writer, records, trained))


def write_hparams_events(
    run_dir: Path,
    hparams: Mapping[str, Any],
    records: Sequence[Mapping[str, Any]],
    trained: TrainedLengths,
) -> Path:
    """(Re)write ``run_dir/HPARAMS_EVENTS_FILE``, atomically: the HParams tab's declaration of
    the run's ``hparams`` and of every metric it has, the training's summary and those of
    ``records``, all of the run's eval records (record_metrics); their values are the hparam/
    scalars of the other event files."""
    names = [*TRAINING_SUMMARY, *record_metrics(records, trained)]
    # The declaration reads the metrics' names alone: their values are not written here.
    summaries = hparams_summaries(dict(hparams), dict.fromkeys(HPARAM_PREFIX + n for n in names))

    def declare(writer: SummaryWriter) -> None:
        for summary in summaries:  # the experiment, the session's start and its end
            writer.file_writer.add_summary(summary)

    return rewrite_events(Path(run_dir) / HPARAMS_EVENTS_FILE, declare)


def rewrite_events(path: Path, write: Callable[[SummaryWriter], None]) -> Path:
    """Replace the event file ``path``, atomically, by the one ``write`` fills."""
    with tempfile.TemporaryDirectory() as scratch:  # SummaryWriter names its own file
        with SummaryWriter(log_dir=scratch) as writer:
            write(writer)
        (written,) = Path(scratch).iterdir()
        with atomic_path(path) as tmp:
            shutil.copyfile(written, tmp)
    return path


def extrapolation_figure(
    records: Sequence[Mapping[str, Any]], train_seq_len: int | None = None
) -> Figure | None:
    """Perplexity against evaluation length (log x), one line per series (plain, each scaling
    method, each stride), or None when nothing was measured."""
    axes = series_axes(records, "ppl")
    if axes is None:
        return None
    if train_seq_len is not None:
        axes.axvline(train_seq_len, color="grey", linestyle="--", label="train length")
    axes.legend()
    axes.set_xscale("log", base=2)
    axes.set_xlabel("evaluation length (tokens)")
    axes.set_ylabel("perplexity")
    return axes.figure


def problem_length_figure(
    records: Sequence[Mapping[str, Any]], trained: TrainedLengths
) -> Figure | None:
    """An algorithmic task's sequence accuracy against problem length, the trained range
    shaded, or None when nothing was measured."""
    axes = series_axes(records, "sequence_accuracy")
    if axes is None:
        return None
    axes.axvspan(trained.lo, trained.hi, color="grey", alpha=0.2, label="trained lengths")
    axes.legend()
    axes.set_xlabel("problem length")
    axes.set_ylabel("sequence accuracy")
    axes.set_ylim(-0.02, 1.02)
    return axes.figure


def series_axes(records: Sequence[Mapping[str, Any]], metric: str) -> Axes | None:
    """Axes with one line of ``metric`` against length per series of the measured records,
    or None when none was measured."""
    series: dict[str, list[tuple[int, float]]] = {}
    for r in records:
        if r["status"] == "ok":
            series.setdefault(series_name(r) or "plain", []).append((r["length"], r[metric]))
    if not series:
        return None
    # matplotlib takes a second to import: a sweep's launcher process, which never draws,
    # and runs that fail early do not pay for it
    from matplotlib.figure import Figure

    axes = Figure(figsize=(5, 3.5), layout="tight").add_subplot()
    for name, points in sorted(series.items()):
        axes.plot(*zip(*sorted(points), strict=True), marker="o", label=name)
    axes.grid(True, alpha=0.3)
    return axes


def log_hparams(
    writer: SummaryWriter, hparams: Mapping[str, Any], metrics: Mapping[str, float]
) -> None:
    """Record the run's hyperparameters and headline metrics for the HParams tab, in the
    run's own directory (run_name ".") so each run is one row."""
    metrics = {HPARAM_PREFIX + k: v for k, v in metrics.items()}
    writer.add_hparams(dict(hparams), metrics, run_name=".")
    writer.flush()


def hparams(cfg: DictConfig) -> dict[str, Any]:
    """The knobs that distinguish runs in TensorBoard's HParams tab, the encoding's options
    included as ``encoding.<key>`` (HParams takes no None or list: they show as "null" and as
    "[rope, none]")."""
    options = {
        f"encoding.{key}": hparam_value(value)
        for key, value in flat_config(cfg.encoding).items()
        if key != "name"
    }
    return {
        "encoding": cfg.encoding.name,
        **options,
        "model": f"{cfg.model.n_layer}x{cfg.model.d_model}",
        # a file corpus by its folder ("wikitext-2"), not by data=text's name "text"
        "data": data_name({"data.name": cfg.data.name, "data.path": cfg.data.get("path")}),
        "seq_len": cfg.train.seq_len,
        "steps": cfg.train.steps,
        "lr": cfg.train.lr,
        "seed": cfg.seed,
    }


def hparam_value(value: Any) -> Any:
    """A config value as TensorBoard's HParams takes it: a number, a string or a bool."""
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ", ".join(str(hparam_value(item)) for item in value) + "]"
    return value


def trained_effective_length(entries: Sequence[Mapping[str, Any]]) -> int | None:
    """The effective context length of the records measured as the run was trained, of
    results.json's ``effective_context_length`` ``entries`` (None: not measured)."""
    lengths = [e["length"] for e in entries if as_trained(e) and e["length"] is not None]
    return lengths[-1] if lengths else None


def headline_metrics(results: Mapping[str, Any]) -> dict[str, float]:
    """The numbers the HParams tab shows beside a run's knobs: its training summary's, and its
    perplexity (a task's accuracy, too) at each evaluated length; an algorithmic task's
    length_generalization summaries; the effective context length measured as it trained."""
    metrics = {name: results["train"][name] for name in TRAINING_SUMMARY}
    effective = trained_effective_length(results.get("effective_context_length", []))
    if effective is not None:
        metrics["effective_context_length"] = effective
    metrics.update(length_metrics(results["eval"]))
    for summary in GENERALIZATION:
        if results.get(summary) is not None:  # an algorithmic task's
            metrics[summary] = results[summary]
    return metrics


GENERALIZATION = ("length_generalization", "length_generalization_accuracy")
TRAINING_SUMMARY = ("final_loss", "val_ppl")  # results.json's "train" metrics in the HParams tab


def length_metrics(records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """``ppl_at_<length>`` and a task's ``accuracy_at_<length>`` (of its own answers, as
    ``eval/accuracy``: none for a record scored under teacher forcing), each of the first record of
    its length (results.json's order: the plain one before a re-evaluation's scaling or
    stride)."""
    metrics: dict[str, float] = {}
    for record in records:
        if record["status"] == "ok":
            metrics.setdefault(f"ppl_at_{record['length']}", record["ppl"])
        accuracy = headline_accuracy(record)  # a task's own answers, as eval/accuracy
        if accuracy is not None:
            metrics.setdefault(f"accuracy_at_{record['length']}", accuracy)
    return metrics


def record_metrics(
    records: Sequence[Mapping[str, Any]], trained: TrainedLengths
) -> dict[str, float]:
    """headline_metrics but the training's summary, read from ``records`` alone."""
    metrics = length_metrics(records)
    if trained.problem_lengths:
        summaries = with_length_generalization({"eval": list(records)}, trained.hi)
        metrics.update({k: summaries[k] for k in GENERALIZATION if summaries[k] is not None})
    else:
        effective = trained_effective_length(effective_context_lengths(records, trained.lo))
        if effective is not None:
            metrics["effective_context_length"] = effective
    return metrics
