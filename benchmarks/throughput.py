"""Training and evaluation throughput of every encoding, as ratios to NoPE in one process.

    python benchmarks/throughput.py [--threads 1] [--length 2048] [--rounds 15] [--device cpu]
        [--precision fp32]   # fp32, bf16 or auto (train.precision; evaluation stays fp32)
        [--longppl]          # also evaluation with LongPPL's key tokens, the model its own
                             # evaluator (posbench eval --metric longppl), as ratios to plain

Timings on a shared machine are noisy, so the numbers that matter are the ratios measured in
the same run with the thread count pinned. Encodings are timed in interleaved rounds (one step
of each per round) and the median per encoding is reported, so a burst of load from another
process hits every encoding alike instead of one of them.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from omegaconf import DictConfig

from posbench.config import compose_config
from posbench.encodings import encoding_names
from posbench.evaluation.longppl import KeyTokens
from posbench.model import build_model
from posbench.system.precision import autocast, resolve_precision

MODEL = {"n_layer": 2, "n_head": 4, "d_model": 128, "mlp_ratio": 4, "dropout": 0.0}


def trained_encoding(encoding: str, seq_len: int, longest: int) -> DictConfig:
    """The encoding's config as `posbench train encoding=<name> train.seq_len=<seq_len>`
    composes it (FIRE's threshold L at seq_len, as a trained model has it), with a learned
    table of ``longest`` rows, so that it can be evaluated that long. ``encoding`` may carry
    options after commas: ``alibi,dape=true`` is encoding=alibi encoding.dape=true."""
    encoding, *options = encoding.split(",")
    overrides = [f"encoding={encoding}", f"train.seq_len={seq_len}"]
    overrides += [f"encoding.{option}" for option in options]
    if encoding == "learned":
        overrides.append(f"encoding.max_length={longest}")
    return compose_config(overrides).encoding


def steps_for(
    encoding: str, seq_len: int, batch: int, eval_length: int, device: str, precision: str = "fp32"
) -> tuple[Callable[[], None], Callable[[], None], Callable[[], None]]:
    """A training step at ``seq_len`` in ``precision`` (train.precision: fp32, bf16 or auto), an
    evaluation forward at ``eval_length`` (fp32, eval.precision's default) and the same window's
    LongPPL evaluation (the key tokens the model selects as its own evaluator, then its NLL)."""
    torch.manual_seed(0)
    model = build_model(MODEL, trained_encoding(encoding, seq_len, eval_length)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 256, (batch, seq_len + 1), device=device)
    long = torch.randint(0, 256, (1, eval_length + 1), device=device)  # inputs and targets
    key_tokens = KeyTokens(model, seq_len)
    resolved = resolve_precision(precision, x.device, MODEL["d_model"])

    def train_step() -> None:
        with autocast(resolved, x.device):  # the loss as posbench's training step computes it
            loss = model(x[:, :-1], targets=x[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss.item()  # wait for the device

    @torch.inference_mode()
    def eval_step() -> None:
        model(long[:, :-1]).sum().item()

    @torch.inference_mode()
    def longppl_step() -> None:
        nll = model(long[:, :-1], targets=long[:, 1:], reduction="none")
        nll[key_tokens(long)].sum().item()

    return train_step, eval_step, longppl_step


def interleaved_seconds(
    steps: dict[str, Callable[[], None]],
    rounds: int,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """Seconds of each step in each of ``rounds`` rounds (one call of every step per round), by
    ``clock`` (wall time; or time.process_time, CLOCKS's cpu).

    Each round starts one step later in the order, so every step runs at every place equally
    often: what runs just before a step changes its time (caches, the allocator's free memory;
    measured on a 2-core VM: one fixed order put t5's training at 0.90x NoPE's speed, another
    at 1.02x), and a fixed order would favour some steps in every round.
    """
    times: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            started = clock()
            steps[name]()
            times[name].append(clock() - started)
    return times


# The clocks a benchmark can time its steps by: the wall time; or the process's CPU time, which
# other jobs on a shared machine disturb far less (2 cores at load average 8-10, 2026-12-06:
# NoPE's training step at 0.19 s of CPU time as on the quiet machine's wall clock, its wall time
# 0.45-0.50 s, every ratio moving by 0.1 between runs). On a CPU only: a GPU's time is not the
# process's.
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def median_seconds(
    steps: dict[str, Callable[[], None]], rounds: int, clock: str = "wall"
) -> dict[str, float]:
    """Median time of each step (by CLOCKS[``clock``]) over ``rounds`` interleaved rounds, after
    a warm-up round (caches and the allocator)."""
    interleaved_seconds(steps, 1)
    times = interleaved_seconds(steps, rounds, CLOCKS[clock])
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=2048, help="evaluation length")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--precision", choices=["fp32", "bf16", "auto"], default="fp32", help="of training"
    )
    parser.add_argument("--longppl", action="store_true", help="also LongPPL's evaluation")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    steps = {
        name: steps_for(name, args.seq_len, args.batch, args.length, args.device, args.precision)
        for name in encoding_names()
    }
    train = median_seconds({name: pair[0] for name, pair in steps.items()}, args.rounds)
    evaluations = {name: pair[1] for name, pair in steps.items()}
    if args.longppl:  # interleaved with the plain ones: their ratio is of one run
        evaluations |= {f"{name}+longppl": pair[2] for name, pair in steps.items()}
    evals = median_seconds(evaluations, args.rounds)
    train_tokens, eval_tokens = args.batch * args.seq_len, args.length
    resolved = resolve_precision(args.precision, torch.device(args.device), MODEL["d_model"])
    print(
        f"threads={args.threads} train {args.batch}x{args.seq_len} in {args.precision} "
        f"({resolved}), eval 1x{args.length} in fp32"
    )
    longppl = f"{'longppl tok/s':>14}{'/ plain':>8}" if args.longppl else ""
    print(f"{'encoding':<12}{'train tok/s':>12}{'ratio':>7}{'eval tok/s':>12}{'ratio':>7}{longppl}")
    for name in steps:
        line = (
            f"{name:<12}{train_tokens / train[name]:>12,.0f}{train['none'] / train[name]:>7.2f}"
            f"{eval_tokens / evals[name]:>12,.0f}{evals['none'] / evals[name]:>7.2f}"
        )
        if args.longppl:
            seconds = evals[f"{name}+longppl"]
            line += f"{eval_tokens / seconds:>14,.0f}{evals[name] / seconds:>8.2f}"
        print(line)


if __name__ == "__main__":
    main()
