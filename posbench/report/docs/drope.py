"""+experiment=drope's block (docs/results.md, "DroPE"): DroPE beside the baselines of its
comparison in one table. ``posbench report`` gives its rows in three groups: the baselines
train 600 steps, DroPE's RoPE phase 528 and its recalibration 72 from that phase's run of its
seed (train.steps, train.init_from). Here each line is the report's row of one method's runs,
found by their job directories (``<method>_seed<seed>``, conf/experiment/drope.yaml), at the
eval-time extension the line is of."""

from __future__ import annotations

from pathlib import Path

from posbench.report.cells import Cell, Stat, cell
from posbench.report.docs.source import Source, provenance_line
from posbench.report.text import best_shown, stat_text

# (line, conf/drope_method/ option, its records' eval-time extension: runs.results.scaling_name)
ROWS = (
    ("NoPE", "nope", "none"),
    ("RoPE", "rope", "none"),
    ("RoPE + YaRN", "rope", "yarn"),  # posbench eval --run S/rope_seed<seed> --rope-scaling yarn
    ("RNoPE-SWA", "rnope_swa", "none"),
    ("DroPE", "drope", "temperature"),  # eval.temperature=fit
)


def method(run: Path) -> str:
    """The conf/drope_method/ option a run of the sweep trained with: its job directory's
    ``<method>_seed<seed>``."""
    return run.name.rsplit("_seed", 1)[0]


def row_cells(source: Source, option: str, scaling: str, lengths: list[int]) -> list[Cell]:
    """The cells at ``lengths`` of the report's row of the runs of ``option`` at ``scaling``
    (whole windows at consecutive positions: as the sweep evaluates them); empty without it."""
    for group in source.report.groups:
        for row in group.rows:
            same = {method(path) for path in row.runs} == {option}
            if same and row.scaling == scaling and row.stride is None and row.positions is None:
                by_length = dict(zip(group.lengths, row.cells, strict=True))
                return [by_length.get(n) or cell(n, []) for n in lengths]
    return [cell(n, []) for n in lengths]


def fitted_c(source: Source) -> Stat:
    """DroPE's fitted temperature slope c (posbench/evaluation/temperature.py) over its runs:
    each run's records hold its one c."""
    return Stat.of(
        [
            next(r["temperature_c"] for r in run.results["eval"] if "temperature_c" in r)
            for run in source.runs
            if method(run.path) == "drope"
        ]
    )


def drope_table(source: Source) -> str:
    """One line per row of ROWS the summary holds runs of: its perplexity at the training
    length, then its ratio at each longer length to its own perplexity there, mean ± std over
    seeds (the best of each column in bold); DroPE's with its fitted c."""
    (train,) = {run.config["train.seq_len"] for run in source.runs}
    lengths = sorted({r["length"] for run in source.runs for r in run.results["eval"]})
    longer = [n for n in lengths if n > train]
    rows = {
        label: cells
        for label, option, scaling in ROWS
        if any((cells := row_cells(source, option, scaling, [train, *longer]))[0].ppl.values)
    }
    c = fitted_c(source)
    if c.n:
        c_text = f"{c.mean:.3f}" + ("" if c.std is None else f" ± {c.std:.3f}")
        rows = {(f"DroPE (c = {c_text})" if k == "DroPE" else k): v for k, v in rows.items()}
    stats = {label: [cells[0].ppl] + [x.ratio for x in cells[1:]] for label, cells in rows.items()}
    best = [best_shown((s[i].mean for s in stats.values()), min) for i in range(len(longer) + 1)]
    lines = [
        f"| method | runs | ppl at {train} | "
        + " | ".join(f"{n} ({n // train}×)" for n in longer)
        + " |",
        "| --- | --- | --- |" + " --- |" * len(longer),
    ]
    for label, row in stats.items():
        texts = ["–" if s.mean is None else stat_text(s, b) for s, b in zip(row, best, strict=True)]
        lines.append(f"| {label} | {row[0].n} | " + " | ".join(texts) + " |")
    return "\n".join(lines)


def drope_results(source: Source) -> str:
    """drope_table, and under it provenance_line naming the commands by the block above it:
    the experiment's two sweeps share one directory, whose multirun.yaml the second rewrites,
    and the committed summary's runs predate results.json's ``ran`` (each run's own command),
    so its provenance records the second sweep's command alone."""
    return f"{drope_table(source)}\n\n{provenance_line(source, 'the commands above')}"
