"""Results as tables and figures: ``posbench report DIR`` (a sweep's answer - which encoding
extrapolates, by how much, with what spread over seeds) and the table of one run's evaluation
that ``posbench train`` and ``posbench eval`` print.

read.py       find the runs below DIR (or in a summary file); read each, or say why it is left
              out; a run repeated (the same config and seed) kept once, the newest
summary.py    a sweep's runs as data (--summary): results/<experiment>/<name>.json
settings.py   what splits runs into groups (training setting, tokens scored, tokenizer), the
              metric when tokenizers differ, group titles
cells.py      a row's cells at one length: mean ± std over its runs, refused where unlike
groups.py     runs grouped, rows by encoding and protocol, their cells (build_report)
aggregate.py  an algorithmic sweep's max and success rate over seeds, mean reciprocal rank
              across tasks, and the baselines over the lengths a score averages
tables.py     Markdown (printed, report.md) and the flat records of report.csv / report.json
generalization.py  an algorithmic sweep's Table 1 and mean reciprocal rank, in both
text.py       a mean ± std as the tables print it, the best in bold
long_context.py  the effective context length (--effective-threshold) and attention-sink
              rate tables
figures.py    the PNG figures and the TensorBoard runs
run_table.py  one run's records as a terminal table, and the ratio's wording both share
reference.py  a sweep against published numbers (--reference): the rows that meet them, the
              warnings where they do not
published.py  a published table: a result whose runs are gone, kept with its provenance
docs/         README's and docs/'s result tables and figures, rendered from results/

Every run below DIR (a directory holding results.json, config.yaml or Hydra's .hydra/) is
read; runs that differ only in their seed are averaged, and runs whose training setting
differs (model, data, train.*) or that scored other numbers of tokens (eval.max_tokens) are
reported in separate groups, never averaged together, each headed by the settings that tell it
from the others (groups.group_titles). Runs with the same config and seed are one run: the
newest is kept, the others listed as its duplicates. A cell whose records are still no sample
over seeds (other numbers of tokens scored, one seed twice) is not averaged: its footnote says
why. Written to DIR/report/ (or --out):

    report.md                    the tables (also printed)
    report.csv, report.json      the same numbers, one row per (group, row, length)
    ppl_vs_length[_<group>].png  perplexity against evaluation length, one line per row
                                 (--metric bits_per_byte or word_ppl: <metric>_vs_length)
    accuracy_vs_length[_<group>].png  a task's answer accuracy against evaluation length
                                 (an algorithmic task's: against problem length, no ppl figure)
    <metric>_ratio_vs_length[_<group>].png  with --reference: the ratio to the training length
                                 against evaluation length, the reference's curves beside
    loss_by_position[_<group>].png  NLL against position in the window at the longest length
    tensorboard/[<group>/]<row>/ the mean curves as TensorBoard runs that overlay in Scalars
                                 (report/ppl, report/ppl_ratio, report/loss_by_position,
                                 report/accuracy; report/<metric> with --metric)

``--metric`` (groups.METRICS) chooses what the tables and the figure show: ``ppl`` (the
default), or ``bits_per_byte`` and ``word_ppl``, which compare runs on different tokenizers
(a run on bytes beside one on BPE tokens: the tokenizer is part of a row's label when the runs
of a group differ in it, not a setting that splits the group). Runs on different tokenizers
are never compared per token: their default is ``bits_per_byte``, and ``ppl`` makes each
tokenizer a group of its own, a line of the report saying which (groups.chosen_metric). A
ratio is each run's metric over its own at the training length measured the same way
(runs.eval_protocol). An encoding whose perplexity there is more than groups.COMPARABLE_PPL
times the best encoding's on its tokenizer did not learn comparably: its rows are marked,
their ratios saying little.

Loss by position is reported at the longest length whose records hold it: the mean NLL per
position bucket over seeds, and per run "nll after / before" = the token-weighted mean NLL of
the buckets at positions >= train.seq_len over that of the buckets below it.

Runs on an algorithmic task (posbench/data/algorithmic/) are evaluated at problem lengths: their
groups show accuracies only, and the report opens with Ruoss et al.'s Table 1, one line per
task and one column per encoding, of the runs' length_generalization summaries: their mean ±
std, max and success rate over seeds (the share above ``--success-threshold``, 0.9), the
per-byte ones beside the task's baselines; then Kazemnejad et al.'s mean reciprocal rank of
each encoding across the tasks.

``--reference NAME`` (posbench/references/: ``alibi-wt103``, the ALiBi paper's WikiText-103
Tables 2 and 3) reads each group against the reference's table of its training length: a
table with a "paper" column beside each encoding the reference has (ratios to the training
length, then values), the paper_value and paper_ratio columns of report.csv, the ratio figure;
the metric defaults to the reference's. Where the sweep and the reference do not match
(training length, evaluation lengths, metric) the command warns, one line each.

For a corpus with documents, the documents scored at each length are shown under the
perplexity table (a document shorter than L + 1 bytes is skipped at L, so lengths can score
different text).
"""

from __future__ import annotations

from pathlib import Path

from posbench.report.figures import (
    FIGURE_DPI,
    accuracy_figure,
    position_figure,
    ratio_figure,
    value_figure,
    write_tensorboard,
)
from posbench.report.groups import Report, build_report, has_accuracy
from posbench.report.reference import compared_rows
from posbench.report.tables import cell_records, csv_text, json_content, markdown
from posbench.system.atomic import atomic_path, atomic_write, replace_directory, write_json

__all__ = ["build_report", "write_report"]


def write_report(report: Report, out: Path) -> list[Path]:
    """Write every output into ``out``, each atomically; return their paths."""
    records = cell_records(report)
    written = [out / "report.md", out / "report.csv", out / "report.json"]
    atomic_write(written[0], markdown(report).encode())
    atomic_write(written[1], csv_text(records).encode())
    write_json(written[2], json_content(report, records))
    for group in report.groups:
        figures = {}
        if group.problem_lengths is None:  # an algorithmic task's ppl says little
            figures[f"{report.metric}_vs_length"] = value_figure(group, report.metric)
        if report.reference is not None and compared_rows(group):
            figures[f"{report.metric}_ratio_vs_length"] = ratio_figure(
                group, report.metric, report.reference
            )
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
