"""Training and evaluation throughput of every encoding, as ratios to NoPE in one process.

    python benchmarks/throughput.py [--threads 1] [--length 2048] [--device cpu]

Timings on a shared machine are noisy, so the numbers that matter are the ratios measured in
the same run with the thread count pinned; absolute tokens/s are printed for reference.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from posbench.encodings import encoding_names
from posbench.model import build_model

MODEL = {"n_layer": 2, "n_head": 4, "d_model": 128, "mlp_ratio": 4, "dropout": 0.0}


def tokens_per_second(step, tokens: int, repeats: int) -> float:
    step()  # warm-up: caches, allocator
    started = time.perf_counter()
    for _ in range(repeats):
        step()
    return tokens * repeats / (time.perf_counter() - started)


def measure(encoding: str, seq_len: int, batch: int, eval_length: int, device: str) -> tuple:
    torch.manual_seed(0)
    model = build_model(MODEL, {"name": encoding, "max_length": eval_length}).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 256, (batch, seq_len + 1), device=device)

    def train_step() -> None:
        loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    long = torch.randint(0, 256, (1, eval_length), device=device)

    @torch.inference_mode()
    def eval_step() -> None:
        model(long)

    return (
        tokens_per_second(train_step, batch * seq_len, repeats=10),
        tokens_per_second(eval_step, eval_length, repeats=3),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=2048, help="evaluation length")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = {
        name: measure(name, args.seq_len, args.batch, args.length, args.device)
        for name in encoding_names()
    }
    train_base, eval_base = results["none"]
    print(f"threads={args.threads} train {args.batch}x{args.seq_len}, eval 1x{args.length}")
    print(f"{'encoding':<12}{'train tok/s':>12}{'ratio':>7}{'eval tok/s':>12}{'ratio':>7}")
    for name, (train_rate, eval_rate) in results.items():
        print(
            f"{name:<12}{train_rate:>12,.0f}{train_rate / train_base:>7.2f}"
            f"{eval_rate:>12,.0f}{eval_rate / eval_base:>7.2f}"
        )


if __name__ == "__main__":
    main()
