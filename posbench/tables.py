"""Results as text tables for the terminal."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from posbench.runs import scaling_name


def eval_table(
    records: Sequence[dict[str, Any]],
    train_seq_len: int,
    references: Sequence[dict[str, Any]] | None = None,
) -> str:
    """Length -> perplexity, with each perplexity's ratio to the one at the training length
    measured the same way (stride, eval-time scaling method and factor), i.e. how much worse
    the model gets past the length it was trained on. That reference is looked up in
    ``references`` (e.g. all of results.json's records, when ``records`` are only the lengths
    just evaluated), else in ``records``."""

    def way(record: dict[str, Any]) -> tuple:
        return record["stride"], scaling_name(record)

    reference = {
        way(r): r["ppl"]
        for r in (records if references is None else references)
        if r["length"] == train_seq_len and r["status"] == "ok"
    }
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
    lines = [header, "-" * len(header)]
    for r in records:
        stride = "-" if r["stride"] is None else str(r["stride"])
        measured = f"{r['length']:>8}  {stride:>6}  {scaling_name(r):>{width}}"
        if r["status"] != "ok":
            lines.append(f"{measured}  unsupported: {r['reason']}")
            continue
        base = reference.get(way(r))
        ratio = f"{r['ppl'] / base:6.2f}" if base else f"{'-':>6}"
        line = f"{measured}  {r['ppl']:9.3f}  {ratio}  {r['bits_per_byte']:9.3f}  {r['tokens']:>9,}"
        if documents:
            count = r.get("documents")
            line += f"  {'-' if count is None else f'{count:,}':>9}"
        if scored:
            line += f"  {r['accuracy']:8.3f}  {r['sequence_accuracy']:8.3f}"
        lines.append(line)
    return "\n".join(lines)


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
