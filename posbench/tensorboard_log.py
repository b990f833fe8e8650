"""What posbench writes to TensorBoard, in one place so train and eval log alike.

The extrapolation curve is a scalar series whose global step is the evaluation length, so
TensorBoard's Scalars tab plots perplexity against length (set its x-axis to "step").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.figure import Figure
from torch.utils.tensorboard import SummaryWriter


def eval_tag(metric: str, record: Mapping[str, Any]) -> str:
    """``eval/<metric>``, suffixed with the stride for sliding-window records."""
    tag = f"eval/{metric}"
    if record.get("stride") is not None:
        tag += f"/stride_{record['stride']}"
    return tag


def log_eval_records(
    writer: SummaryWriter, records: Sequence[Mapping[str, Any]], train_seq_len: int
) -> None:
    """One point per evaluated length on ``eval/ppl`` and ``eval/bits_per_byte``."""
    for record in records:
        if record["status"] == "ok":
            writer.add_scalar(eval_tag("ppl", record), record["ppl"], global_step=record["length"])
            writer.add_scalar(
                eval_tag("bits_per_byte", record),
                record["bits_per_byte"],
                global_step=record["length"],
            )
    figure = extrapolation_figure(records, train_seq_len)
    if figure is not None:
        writer.add_figure("eval/ppl_vs_length", figure)
    writer.flush()


def extrapolation_figure(
    records: Sequence[Mapping[str, Any]], train_seq_len: int | None = None
) -> Figure | None:
    """Perplexity against evaluation length (log x), or None when nothing was measured."""
    points = sorted((r["length"], r["ppl"]) for r in records if r["status"] == "ok")
    if not points:
        return None
    figure = Figure(figsize=(5, 3.5), layout="tight")
    axes = figure.add_subplot()
    axes.plot(*zip(*points, strict=True), marker="o")
    if train_seq_len is not None:
        axes.axvline(train_seq_len, color="grey", linestyle="--", label="train length")
        axes.legend()
    axes.set_xscale("log", base=2)
    axes.set_xlabel("evaluation length (tokens)")
    axes.set_ylabel("perplexity")
    axes.grid(True, alpha=0.3)
    return figure


def log_hparams(
    writer: SummaryWriter, hparams: Mapping[str, Any], metrics: Mapping[str, float]
) -> None:
    """Record the run's hyperparameters and headline metrics for the HParams tab, in the
    run's own directory (run_name ".") so each run is one row."""
    writer.add_hparams(dict(hparams), {f"hparam/{k}": v for k, v in metrics.items()}, run_name=".")
    writer.flush()
