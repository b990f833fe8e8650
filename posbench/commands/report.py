"""``posbench report DIR [--out OUT]``: compare the runs of a sweep (posbench/report/)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from posbench.commands.arguments import OneLineParser
from posbench.report import build_report, write_report
from posbench.report.groups import METRICS
from posbench.report.tables import markdown


def report_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="posbench report",
        description="Compare the runs below DIR (a multirun directory or any folder of runs): "
        "mean ± std perplexity over seeds per encoding and length, as Markdown (printed), "
        "CSV, JSON, a PNG plot and TensorBoard runs. Unfinished and diverged runs are listed, "
        "not averaged.",
    )
    parser.add_argument("dir", type=Path, metavar="DIR", help="searched recursively for runs")
    parser.add_argument(
        "--out", type=Path, metavar="OUT", help="output directory (default: DIR/report)"
    )
    parser.add_argument(
        "--metric",
        choices=list(METRICS),
        default="ppl",
        help="what the tables and the figure show, each with its ratio to the training length: "
        "ppl (per token, the default), bits_per_byte or word_ppl (per byte and per word of the "
        "text: these compare runs on different tokenizers)",
    )
    return parser


def run_report(args: Sequence[str]) -> None:
    options = report_parser().parse_args(list(args))
    out = options.out if options.out is not None else options.dir / "report"
    report = build_report(options.dir, out, options.metric)
    written = write_report(report, out)
    print(markdown(report))
    print("wrote " + ", ".join(str(path) for path in written))
