"""A corpus sweep's blocks (perplexity against evaluation length): README's ratio table and
per-family figure of the experiment's own runs, and docs/results.md's tables of every row
(variants from later sweeps beside them: eval-time scaling, options, randomized positions)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from posbench.report.cells import Stat
from posbench.report.docs.source import Source, commands_text, provenance_line
from posbench.report.figures import position_figure, value_figure
from posbench.report.groups import Row, report_of
from posbench.report.long_context import effective_table, tokens_text
from posbench.report.settings import ATTENTION_VARIANTS
from posbench.report.styles import variant_colour_styles
from posbench.report.summary import provenance_parts
from posbench.report.tables import markdown_table, position_table, row_name
from posbench.report.text import best_shown, stat_text


def row_labels(rows: list[Row]) -> dict[int, str]:
    """Each row's label in README's table and figure: its encoding's name where that tells the
    rows apart (an option that differs only from a variant's row is not shown), else its
    report label."""
    names = [row.name for row in rows]
    unique = len(set(names)) == len(names)
    return {id(row): row.name if unique else row.label for row in rows}


def ratio_table(source: Source) -> str:
    """The experiment's own rows: each one's perplexity at the training length, then its ratio
    at each longer length (mean over seeds, below 1: the longer context helps), rows by the
    ratio at the longest length, the best of each column in bold."""
    group = source.main_group()
    rows = source.main_rows(group)
    labels = row_labels(rows)
    train = group.train_seq_len
    longer = [i for i, n in enumerate(group.lengths) if n > train]
    at_train = group.lengths.index(train)
    lines = [
        f"| encoding | ppl at {train} | "
        + " | ".join(f"{group.lengths[i]} ({group.lengths[i] // train}×)" for i in longer)
        + " |",
        "| --- | --- |" + " --- |" * len(longer),
    ]

    def last_ratio(row: Row) -> float:
        mean = row.cells[longer[-1]].ratio.mean
        return float("inf") if mean is None else mean

    rows = sorted(rows, key=last_ratio)
    best_ppl = best_shown((row.cells[at_train].value.mean for row in rows), min)
    best = {i: best_shown((row.cells[i].ratio.mean for row in rows), min) for i in longer}
    for row in rows:
        texts = [mean_text(row.cells[at_train].value.mean, best_ppl)]
        for i in longer:
            c = row.cells[i]
            texts.append("unsupported" if c.unsupported else mean_text(c.ratio.mean, best[i]))
        lines.append(f"| {labels[id(row)]} | " + " | ".join(texts) + " |")
    return "\n".join(lines)


def mean_text(mean: float | None, best: str | None) -> str:
    """A mean to two decimals, bold where it prints as ``best``; a dash where unmeasured."""
    if mean is None:
        return "–"
    return f"**{mean:.2f}**" if f"{mean:.2f}" == best else f"{mean:.2f}"


def corpus_provenance(source: Source) -> str:
    """How the summary's runs were made in one sentence (README's: its first sweep's command,
    how many were added later, the commits, machines and days; docs/results.md's provenance
    line spells out each), then the data's best possible perplexity (its entropy floor, in
    the runs' records), which the ratios are read against."""
    first, *added = provenance_parts(source.provenance)
    commands = commands_text(first["commands"])
    commits = sorted({c[:7] for part in (first, *added) for c in part["posbench_commits"]})
    machines = "; ".join(dict.fromkeys(p["machine"] for p in (first, *added) if p["machine"]))
    days = ", ".join(dict.fromkeys(part["date"] for part in (first, *added)))
    later = f", then {sum(part['runs'] for part in added)} more from later sweeps" * bool(added)
    (bits,) = {run.results["data"]["entropy_floor_bits_per_byte"] for run in source.runs}
    return (
        f"{first['runs']} runs of {commands}{later} ([Results](docs/results.md) lists every "
        f"command), at {', '.join(commits)} on {machines}, {days}; summary: `{source.name}`. "
        f"The data's best possible perplexity, its entropy floor with the whole past as "
        f"context: {2**bits:.2f}."
    )


def main_position_figure(source: Source):  # -> matplotlib Figure
    """The experiment's own rows' loss by position at the longest length, as the report draws
    it."""
    group = source.main_group()
    return position_figure(replace(group, rows=source.main_rows(group)))


def corpus_details(source: Source) -> str:
    """Per group (randomized positions train apart): perplexity and its ratio to the training
    length, mean ± std over seeds, every row; then the loss by position at the longest
    length."""
    lines = [provenance_line(source)]
    footnotes: dict[str, int] = {}
    for group in source.report.groups:
        lines += ["", f"{group.title}: perplexity, mean ± sample std over seeds (lowest in bold):"]
        lines += ["", *markdown_table(group, "value", footnotes)]
        lines += ["", "Its ratio to the perplexity at the training length, run by run:"]
        lines += ["", *markdown_table(group, "ratio", footnotes)]
        if group.position_length is not None:
            lines += ["", *position_table(group, footnotes)]
    lines += ["", *(f"- [{n}] {text}" for text, n in footnotes.items())]
    return "\n".join(lines)


def effective_lengths(source: Source) -> str:
    """Per group: each row's effective context length at the report's threshold
    (``--effective-threshold``, long_context.effective_table), in tokens and training
    lengths, mean ± std over seeds."""
    lines: list[str] = []
    footnotes: dict[str, int] = {}
    for group in source.report.groups:
        lines += ["", f"{group.title}:", ""]
        lines += effective_table(source.report, group, lambda row: row_name(row, footnotes))
    lines += ["", *(f"- [{n}] {text}" for text, n in footnotes.items())] if footnotes else []
    return "\n".join(lines[1:])


def main_group_figure(source: Source):  # -> matplotlib Figure
    """The experiment's own rows' perplexity against evaluation length as the report draws it
    (figures.value_figure: a panel per family past PANEL_CURVES, NoPE in each), each row named
    as in README's table."""
    group = source.main_group()
    rows = source.main_rows(group)
    labels = row_labels(rows)
    return value_figure(replace(group, rows=[replace(row, label=labels[id(row)]) for row in rows]))


def rope_variants_figure(source: Source):  # -> matplotlib Figure
    """RoPE's rows of the group holding the experiment's runs beside NoPE's, as the report
    draws them: past PANEL_CURVES curves, one panel of RoPE's eval-time extensions and
    positions, one of the attention variants (ATTENTION_VARIANTS), plain RoPE and NoPE in
    both; RoPE's rows each in a colour of its own (variant_colour_styles)."""
    group = source.main_group()
    config = {run.path: run.config for run in source.runs}

    def is_variant(row: Row) -> bool:
        return any(
            config[path].get(key, default) != default
            for path in row.runs
            for key, default in ATTENTION_VARIANTS.items()
        )

    def panels(rows: list[Row]) -> list[tuple[str, list[Row]]]:
        plain = [r for r in rows if r.label in ("none", "rope")]
        return [
            ("RoPE's extensions and positions", [r for r in rows if not is_variant(r)]),
            ("attention variants", plain + [r for r in rows if is_variant(r)]),
        ]

    rows = [r for r in group.rows if r.name in ("none", "rope")]
    return value_figure(
        replace(group, rows=rows), panels_of=panels, styles_of=variant_colour_styles
    )


def long_context_table(source: Source) -> str:
    """The experiment's own rows: each one's effective context length (at the report's
    threshold), then its perplexity and its LongPPL at each length where an evaluator run
    selected key tokens (mean ± std over seeds, the lowest of a column in bold); under the
    table, the evaluator and how many tokens it selected at each length."""
    group = source.main_group()
    rows = source.main_rows(group)
    labels = row_labels(rows)
    S, t = group.train_seq_len, source.report.effective_threshold
    keyed = [r for run in source.runs for r in run.results["eval"] if r.get("key_tokens")]
    lengths = sorted({r["length"] for r in keyed})
    # the same runs grouped alike, LongPPL as the cells' value (report --metric longppl)
    by_longppl = report_of(source.runs, [], [source.path], metric="longppl")
    longppl_rows = {
        tuple(row.runs): row for g in by_longppl.groups for row in g.rows if row.as_trained
    }

    def values(row: Row, length: int) -> tuple[Stat | None, Stat | None]:
        i = group.lengths.index(length)
        other = longppl_rows.get(tuple(row.runs))
        return row.cells[i].value, None if other is None else other.cells[i].value

    columns = [(n, k) for n in lengths for k in (0, 1)]
    best = {
        (n, k): best_shown((values(row, n)[k].mean for row in rows if values(row, n)[k]), min)
        for n, k in columns
    }
    lines = [
        f"| encoding | runs | effective length (× {S}) | "
        + " | ".join(f"{'LongPPL' if k else 'ppl'} at {n}" for n, k in columns)
        + " |",
        "| --- | --- | --- |" + " --- |" * len(columns),
    ]
    for row in sorted(rows, key=lambda row: labels[id(row)]):
        stat = row.effective
        effective = "–" if stat.mean is None else f"{tokens_text(stat)} ({stat.mean / S:.1f}×)"
        cells = []
        for n, k in columns:
            value = values(row, n)[k]
            cells.append(
                "–" if value is None or value.mean is None else stat_text(value, best[(n, k)])
            )
        lines.append(
            f"| {labels[id(row)]} | {len(row.runs)} | {effective} | " + " | ".join(cells) + " |"
        )
    if not keyed:
        return "\n".join(
            [*lines, "", "No LongPPL record: posbench eval --metric longppl --evaluator RUN."]
        )
    evaluators = sorted({Path(r["longppl_evaluator"]).name for r in keyed})
    counts = ", ".join(
        f"{count_text(r['key_tokens'] for r in keyed if r['length'] == n)} at {n}" for n in lengths
    )
    lines += [
        "",
        f"Effective length at threshold {t:g}: the longest evaluated length up to which the "
        f"perplexity stays within 1 / {t:g} of its value at {S}, mean ± std over seeds. "
        f"LongPPL: the perplexity over the key tokens the evaluator run "
        f"{', '.join(f'`{e}`' for e in evaluators)} selected (alpha {keyed[0]['longppl_alpha']:g}, "
        f"beta {keyed[0]['longppl_beta']:g}): {counts} tokens were key.",
    ]
    return "\n".join(lines)


def count_text(counts: Iterable[int]) -> str:
    """A count that may vary by run: "12", or "7 to 9"."""
    low, high = min(counts := list(counts)), max(counts)
    return f"{low:,}" if low == high else f"{low:,} to {high:,}"
