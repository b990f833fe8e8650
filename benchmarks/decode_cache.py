"""Greedy decoding of long answers with the key-value cache against recomputing the prefix at
every step, as ratios in one process.

    python benchmarks/decode_cache.py [--threads 1] [--rounds 5] [--task reverse_string]
        [--lengths 100 200 400] [--examples 16] [--encodings rope alibi fire] [--quick]

``posbench.evaluation.decode.greedy_decode`` decodes a batch of ``--examples`` problems of each
problem length, on ``+experiment=algorithmic``'s model (Ruoss et al.'s shape: 5 layers, width 64,
untrained: the work is the same whatever it predicts), once with its cache (one token through
the model per step) and once recomputing the whole prefix per step, interleaved, on the same
examples. ``--quick``: one small length, for tests/test_benchmarks.py.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from throughput import median_seconds

from posbench.config import compose_config
from posbench.data import load_data
from posbench.evaluation.decode import greedy_decode
from posbench.model import build_model


def decodes(
    task: str, encoding: str, length: int, examples: int
) -> tuple[dict[str, Callable[[], None]], int]:
    """Greedy decodes of ``examples`` problems of ``task`` at ``length`` with ``encoding``,
    cached and recomputed, and the window they decode."""
    # Autoregressive answers: at placeholders one forward pass writes them, nothing to decode.
    overrides = [f"data={task}", "data.answer_mode=autoregressive", f"encoding={encoding}"]
    cfg = compose_config(["+experiment=algorithmic", *overrides, "threads=1"])
    data = load_data({**cfg.data, "val_examples": examples})
    batch = data.examples(length)
    inputs, answer = batch.inputs(), batch.answer
    torch.manual_seed(0)
    model = build_model(cfg.model, cfg.encoding, data.vocab_size).eval()
    steps = {
        "cached": lambda: greedy_decode(model, inputs, answer),
        "recomputed": lambda: greedy_decode(model, inputs, answer, use_cache=False),
    }
    return steps, batch.window()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--task", default="reverse_string")
    parser.add_argument("--lengths", nargs="+", type=int, default=[100, 200, 400])
    parser.add_argument("--examples", type=int, default=16)
    parser.add_argument("--encodings", nargs="+", default=["rope", "alibi", "fire"])
    parser.add_argument("--quick", action="store_true", help="one length of 20, one round")
    args = parser.parse_args()
    if args.quick:
        args.lengths, args.rounds, args.examples, args.encodings = [20], 1, 4, ["rope"]
    torch.set_num_threads(args.threads)
    print(
        f"{args.task}, {args.examples} problems a batch, threads={args.threads}, medians of "
        f"{args.rounds} rounds; ratio: recomputed / cached"
    )
    print(f"{'encoding':<10}{'length':>8}{'window':>8}{'cached':>12}{'recomputed':>12}{'ratio':>8}")
    for encoding in args.encodings:
        for length in args.lengths:
            steps, window = decodes(args.task, encoding, length, args.examples)
            seconds = median_seconds(steps, args.rounds)
            cached, recomputed = seconds["cached"], seconds["recomputed"]
            print(
                f"{encoding:<10}{length:>8}{window:>8}{cached:>11.2f}s{recomputed:>11.2f}s"
                f"{recomputed / cached:>8.1f}"
            )


if __name__ == "__main__":
    main()
