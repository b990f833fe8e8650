"""``posbench report DIR [DIR ...] [--out OUT] [--summary FILE]``: compare the runs of sweeps
(posbench/report/), or keep their records as data (posbench/report/summary.py)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from posbench.commands.arguments import OneLineParser
from posbench.commands.exits import say
from posbench.references import load_reference, reference_names
from posbench.report import build_report, write_report
from posbench.report.aggregate import DEFAULT_SUCCESS_THRESHOLD
from posbench.report.groups import METRICS
from posbench.report.read import find_runs
from posbench.report.reference import reference_warnings
from posbench.report.summary import is_summary, write_summary
from posbench.report.tables import markdown
from posbench.runs.results import DEFAULT_EFFECTIVE_THRESHOLD


def report_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="posbench report",
        description="Compare the runs below DIR (a multirun directory or any folder of runs; "
        "several DIRs are read as one sweep, e.g. a sweep and one that added rows to it): "
        "mean ± std perplexity over seeds per encoding and length, as Markdown (printed), "
        "CSV, JSON, a PNG plot and TensorBoard runs. Unfinished and diverged runs are listed, "
        "not averaged, and so are runs repeated (the same config and seed: the newest is kept).",
    )
    parser.add_argument(
        "dirs",
        type=Path,
        nargs="+",
        metavar="DIR",
        help="searched recursively for runs; or a summary file (results/<experiment>/<name>.json) "
        "read as the runs it holds",
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="OUT",
        help="output directory (default: DIR/report, or outputs/reports/<experiment>_<name> for "
        "a summary; required with several DIRs)",
    )
    parser.add_argument(
        "--summary",
        type=Path,
        metavar="FILE",
        help="also write the runs' records (config and results.json, no weights) to FILE as "
        "data docs are rendered from, e.g. results/<experiment>/<name>.json; FILE may be a "
        "summary among the DIRs, which a later sweep's runs are then written into",
    )
    parser.add_argument(
        "--metric",
        choices=list(METRICS),
        help="what the tables and the figure show, each with its ratio to the training length: "
        "ppl (per token: the default, and compared within each tokenizer), bits_per_byte (the "
        "default for runs on several tokenizers), word_ppl (per byte and per word of the "
        "text: these compare runs on different tokenizers) or longppl (over the key tokens of "
        "posbench eval --metric longppl); with --reference, the reference's",
    )
    parser.add_argument(
        "--reference",
        metavar="NAME",
        help="published numbers to read the sweep against: a table with a paper column beside "
        "each encoding they have and their ratio curves in a figure; "
        f"{', '.join(reference_names())} (the ALiBi paper's WikiText-103 Tables 2 and 3), or "
        "the path of a reference JSON file (posbench/references/ describes the format)",
    )
    parser.add_argument(
        "--success-threshold",
        type=float,
        default=DEFAULT_SUCCESS_THRESHOLD,
        metavar="T",
        help="an algorithmic sweep's success rate: the share of a row's seeds whose "
        f"length-generalization score is above T, in [0, 1) (default {DEFAULT_SUCCESS_THRESHOLD})",
    )
    parser.add_argument(
        "--effective-threshold",
        type=float,
        default=DEFAULT_EFFECTIVE_THRESHOLD,
        metavar="T",
        help="effective context length: the longest length up to which every evaluated length "
        "keeps accuracy >= T x its value at the training length, or perplexity <= its value "
        f"there / T, in (0, 1] (default {DEFAULT_EFFECTIVE_THRESHOLD})",
    )
    return parser


def run_report(args: Sequence[str]) -> None:
    parser = report_parser()
    options = parser.parse_args(list(args))
    if options.out is None and len(options.dirs) > 1:
        parser.error("with several DIRs, say where the report goes: --out OUT")
    out = options.out if options.out is not None else default_out(options.dirs[0])
    reference = None if options.reference is None else load_reference(options.reference)
    metric = options.metric or (reference.metric if reference is not None else None)
    report = build_report(
        options.dirs,
        out,
        metric,
        reference,
        options.success_threshold,
        options.effective_threshold,
    )
    for warning in reference_warnings(report):
        say(f"warning: {warning}")
    written = write_report(report, out)
    if options.summary is not None:
        runs, _ = find_runs(options.dirs, skip=out)
        write_summary(options.summary, runs, options.dirs)
        written.append(options.summary)
    print(markdown(report))
    print("wrote " + ", ".join(str(path) for path in written))


def default_out(source: Path) -> Path:
    """Where a report goes without --out: into the sweep's directory, or for a summary (in the
    repository) below outputs/, which git ignores."""
    if is_summary(source):
        return Path("outputs") / "reports" / f"{source.parent.name}_{source.stem}"
    return source / "report"
