"""``posbench diagnose --length N [--run DIR]``: attention statistics of a trained run by query
position, per layer and head (posbench/evaluation/diagnose.py)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from posbench.commands.arguments import OneLineParser, add_run_argument, chosen_run, positive_int
from posbench.evaluation.diagnose import diagnose_run, summary_table
from posbench.evaluation.sink import SINK_EPSILON, SINK_TOKEN, check_sink


def diagnose_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="posbench diagnose",
        description="Exact attention statistics of a trained run on windows of its validation "
        "split, per layer, head and query-position bucket: entropy, mean attended distance, "
        "mass on the first token, mass at distances >= train.seq_len; and the attention-sink "
        "rate Sink^eps_k per layer and over the run (Gu et al. 2025). Writes "
        "DIR/diagnostics/L<N>.json, PNG figures and TensorBoard images, and the sink rate into "
        "DIR/results.json.",
    )
    parser.add_argument(
        "--length", type=positive_int, required=True, metavar="N", help="window length in tokens"
    )
    add_run_argument(parser)
    parser.add_argument(
        "--windows",
        type=positive_int,
        default=4,
        metavar="K",
        help="validation windows averaged over (default: 4)",
    )
    parser.add_argument(
        "--sink-epsilon",
        type=float,
        default=SINK_EPSILON,
        metavar="EPS",
        help="a head sinks on token k when its mean attention there exceeds EPS "
        f"(default: {SINK_EPSILON}, Gu et al.'s)",
    )
    parser.add_argument(
        "--sink-token",
        type=positive_int,
        default=SINK_TOKEN,
        metavar="K",
        help=f"the token k of Sink^eps_k, 1 = the window's first (default: {SINK_TOKEN})",
    )
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    return parser


def run_diagnose(args: Sequence[str]) -> None:
    options = diagnose_parser().parse_args(list(args))
    check_sink(options.length, options.sink_epsilon, options.sink_token)  # before finding a run
    run_dir = chosen_run(options)
    result, written = diagnose_run(
        run_dir,
        options.length,
        options.windows,
        options.device,
        options.sink_epsilon,
        options.sink_token,
    )
    print(
        f"{result['encoding']} trained at {result['train_seq_len']} ({run_dir}): attention at "
        f"{result['length']} tokens, averaged over {result['windows']} windows"
    )
    print(summary_table(result))
    by_layer = ", ".join(f"{rate:.2f}" for rate in result["sink_rate_by_layer"])
    print(
        f"Sink^{result['sink_epsilon']:g}_{result['sink_token']} (share of heads whose mean "
        f"attention on token {result['sink_token']} exceeds {result['sink_epsilon']:g}): "
        f"{result['sink_rate']:.3f}; by layer: {by_layer}"
    )
    print("wrote " + ", ".join(str(path) for path in written))
