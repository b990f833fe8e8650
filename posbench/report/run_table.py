"""One run's evaluation records as the terminal table that ``posbench train`` and ``posbench
eval`` print, and the words for a ratio that the sweep report's tables use too."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig

from posbench.runs.results import (
    eval_protocol,
    headline_accuracy,
    protocol_text,
    scaling_name,
    training_length_ppl,
)
from posbench.runs.tensorboard_log import trained_lengths


def trained_at(cfg: DictConfig) -> str:
    """What a run trained at, in the words its tables use: "128" (tokens), or an algorithmic
    task's "problem lengths 1-40"."""
    trained = trained_lengths(cfg)
    if not trained.problem_lengths:
        return str(trained.hi)
    return f"problem lengths {trained.lo}–{trained.hi}"


def run_table(
    cfg: DictConfig,
    records: Sequence[dict[str, Any]],
    results: dict[str, Any],
) -> str:
    """The table ``posbench train`` and ``posbench eval`` print of ``records`` (of the run
    configured by ``cfg``, whose results.json holds ``results``): ``eval_table``, or for an
    algorithmic task ``problem_length_table``."""
    trained = trained_lengths(cfg)
    if not trained.problem_lengths:
        return eval_table(records, trained.hi, references=results["eval"])
    return problem_length_table(records, trained.hi, results)


def problem_length_table(
    records: Sequence[dict[str, Any]], longest_trained: int, results: dict[str, Any]
) -> str:
    """An algorithmic task's records by problem length: the window its longest example took,
    the answers' perplexity, accuracy and sequence accuracy (no ratio: a problem length is
    no multiple of a window), then the run's length_generalization summary."""
    header = (
        f"{'length':>8}  {'window':>8}  {'ppl':>9}  {'accuracy':>8}  {'seq acc':>8}  "
        f"{'examples':>8}"
    )
    lines = [header, "-" * len(header)]
    for r in records:
        beyond = "*" if r["length"] > longest_trained else " "
        measured = f"{r['length']:>7}{beyond}"
        if r["status"] != "ok":
            lines.append(f"{measured}  unsupported: {r['reason']}")
            continue
        lines.append(
            f"{measured}  {r['window']:>8,}  {r['ppl']:9.3f}  {accuracy_text(r)}  "
            f"{r['sequence_accuracy']:8.3f}  {r['examples']:>8,}"
        )
    lines.append(f"* past the training range (problem lengths up to {longest_trained})")
    score = results.get("length_generalization")
    if score is None:
        lines.append(
            "length_generalization: none (no length past the training range, or one of them "
            "unsupported)"
        )
    else:
        accuracy = results["length_generalization_accuracy"]
        per_byte = "" if accuracy is None else f" ({accuracy:.3f} mean accuracy)"
        lines.append(
            f"length_generalization: {score:.3f} mean sequence accuracy past the training "
            f"range{per_byte}"
        )
    return "\n".join(lines)


def eval_table(
    records: Sequence[dict[str, Any]],
    train_seq_len: int,
    references: Sequence[dict[str, Any]] | None = None,
) -> str:
    """Length -> perplexity, with each perplexity's ratio to the one at the training length
    measured the same way (``runs.eval_protocol``: stride, eval-time scaling method and factor,
    positions), i.e. how much worse the model gets past the length it was trained on. That
    reference is looked up in ``references`` (e.g. all of results.json's records, when
    ``records`` are only the lengths just evaluated), else in ``records``. The first line names
    it; a ratio without one is "-", and a footnote under the table says why."""
    reference = training_length_ppl(records if references is None else references, train_seq_len)
    unreferenced: dict[str, None] = {}  # the protocols without a reference, in table order
    width = max([7, *(len(scaling_name(r)) for r in records)])
    scored = any("accuracy" in r for r in records)  # a task's records: answer accuracy too
    # a corpus with documents: longer lengths may skip the shorter ones, so say how many
    documents = any(r.get("documents") is not None for r in records)
    header = (
        f"{'length':>8}  {'stride':>6}  {'scaling':>{width}}  {'ppl':>9}  {'ratio':>6}  "
        f"{'bits/byte':>9}  {'tokens':>9}"
        + (f"  {'documents':>9}" if documents else "")
        + (f"  {'accuracy':>8}  {'seq acc':>8}" if scored else "")
    )
    lines = [f"ratio: {ratio_title(train_seq_len)}", header, "-" * len(header)]
    for r in records:
        stride = "-" if r["stride"] is None else str(r["stride"])
        measured = f"{r['length']:>8}  {stride:>6}  {scaling_name(r):>{width}}"
        if r["status"] != "ok":
            lines.append(f"{measured}  unsupported: {r['reason']}")
            continue
        base = reference.get(eval_protocol(r))
        if base is None:
            unreferenced[protocol_text(r)] = None
        ratio = f"{'-':>6}" if base is None else f"{r['ppl'] / base:6.2f}"
        line = f"{measured}  {r['ppl']:9.3f}  {ratio}  {r['bits_per_byte']:9.3f}  {r['tokens']:>9,}"
        if documents:
            count = r.get("documents")
            line += f"  {'-' if count is None else f'{count:,}':>9}"
        if scored:
            line += f"  {accuracy_text(r)}  {r['sequence_accuracy']:8.3f}"
        lines.append(line)
    lines += [f"ratio -: {no_reference(train_seq_len, protocol)}" for protocol in unreferenced]
    return "\n".join(lines)


def accuracy_text(record: dict[str, Any]) -> str:
    """A task record's accuracy (the model's own answer's: written at placeholders, or its
    greedy decode) in 8 characters; "-" when it was scored under teacher forcing
    (runs.headline_accuracy)."""
    accuracy = headline_accuracy(record)
    return f"{'-':>8}" if accuracy is None else f"{accuracy:8.3f}"


def ratio_title(train_seq_len: int, metric: str = "ppl") -> str:
    """What a ratio divides by, in the same words in every table that shows one."""
    return f"{metric} / {metric} at {train_seq_len} (same protocol: stride, scaling, positions)"


def no_reference(train_seq_len: int, protocol: str) -> str:
    """Why a ratio is missing: nothing at the training length measured its way."""
    return (
        f"no ppl at {train_seq_len} measured the same way ({protocol}); evaluate length "
        f"{train_seq_len} that way too for a ratio"
    )


def data_baselines(data: dict[str, Any]) -> str:
    """The reference points a perplexity (bits per byte) or a task's accuracy is read against."""
    if "chance_accuracy" in data:
        chance = data["chance_accuracy"]
        return f"data {data['name']}: chance accuracy {chance:.3f} (a model that never looks back)"
    line = f"data {data['name']}: unigram {data['unigram_bits_per_byte']:.3f} bits/byte"
    floor = data.get("entropy_floor_bits_per_byte")
    if floor is not None:
        line += f", entropy floor {floor:.3f} bits/byte (the best any model can do)"
    return line
