"""An algorithmic task's training step with its batch run in width slices, against running it
whole, as ratios in one process.

    python benchmarks/task_steps.py [--threads 1] [--rounds 20] [--tasks duplicate_string ...]
        [--encodings rope fire] [--slices 1 2 4 8]

Each task's batch is as wide as its longest problem; ``train_step`` sorts the rows by the width
their answers reach and runs them in up to ``WIDTH_SLICES`` slices, each cut to its own widest
row (posbench/training/train_loop.py, ``width_slices``). This times ``train_step`` itself
(forward, backward and AdamW) on ``+experiment=algorithmic``'s model and batches, with
``WIDTH_SLICES`` set to each of ``--slices`` (1: the whole batch at once), on the same batches, in
interleaved rounds.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from throughput import median_seconds

from posbench.config import compose_config
from posbench.data import load_data
from posbench.model import build_model
from posbench.training import train_loop
from posbench.training.train import make_optimizer

TASKS = ["parity_check", "lego", "reverse_string", "duplicate_string"]
BATCHES = 8  # distinct batches, cycled: the problem lengths differ from step to step


def step_with(task: str, encoding: str, slices: int) -> Callable[[], None]:
    """One of +experiment=algorithmic's training steps on ``task`` with ``encoding``, its batch
    run in at most ``slices`` slices; every call draws the next of BATCHES batches."""
    cfg = compose_config(["+experiment=algorithmic", f"data={task}", f"encoding={encoding}"])
    data = load_data(cfg.data)
    torch.manual_seed(0)
    model = build_model(cfg.model, cfg.encoding, data.vocab_size)
    optimizer = make_optimizer(model, cfg.train)
    calls = 0

    def step() -> None:
        nonlocal calls
        sampler = torch.Generator().manual_seed(calls % BATCHES)  # the same batches each way
        train_loop.WIDTH_SLICES = slices
        train_loop.train_step(model, optimizer, data, sampler, calls, cfg.train)
        calls += 1

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--tasks", nargs="+", default=TASKS)
    parser.add_argument("--encodings", nargs="+", default=["rope", "fire"])
    parser.add_argument("--slices", nargs="+", type=int, default=[1, 2, 4, 8])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    first = args.slices[0]
    print(f"threads={args.threads}, medians of {args.rounds} rounds; ratio: {first} slices / n")
    header = "".join(f"{f'{n} slices':>12}{'ratio':>7}" for n in args.slices)
    print(f"{'task':<20}{'encoding':<10}{header}")
    for task in args.tasks:
        for encoding in args.encodings:
            steps = {n: step_with(task, encoding, n) for n in args.slices}
            seconds = median_seconds(steps, args.rounds)
            cells = "".join(
                f"{seconds[n] * 1e3:>10.1f}ms{seconds[first] / seconds[n]:>7.2f}" for n in steps
            )
            print(f"{task:<20}{encoding:<10}{cells}")


if __name__ == "__main__":
    main()
