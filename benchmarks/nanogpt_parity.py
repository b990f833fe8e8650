"""posbench's training step against nanoGPT's at the same shapes, as ratios in one process.

    python benchmarks/nanogpt_parity.py --nanogpt PATH/TO/nanoGPT/model.py [--threads 2]
        [--shapes 4x256 4x128] [--encodings none rope alibi] [--rounds 30]

nanoGPT (https://github.com/karpathy/nanoGPT) is not a dependency of posbench: clone it and
pass its model.py. Both models are built at each shape (layers x d_model, 4 heads, MLP 4x,
byte vocabulary, no dropout, no biases in the linear layers: nanoGPT's ``bias=False``), fp32,
and trained with the same step: forward, cross-entropy, backward, AdamW. nanoGPT learns
absolute positions (its ``wpe``), which NoPE does without, so posbench NoPE does slightly less
work. Steps are timed in interleaved rounds (throughput.py's ``interleaved_seconds``); the
ratios are posbench's tokens/s over nanoGPT's at the same shape.
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
from throughput import median_seconds, trained_encoding

from posbench.model import build_model

N_HEAD = 4
VOCAB = 256


def load_nanogpt(path: Path) -> ModuleType:
    """nanoGPT's model.py as a module."""
    spec = importlib.util.spec_from_file_location("nanogpt_model", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def training_step(model: torch.nn.Module, loss_of: Loss, batch: torch.Tensor) -> Callable[[], None]:
    """One step of AdamW on ``loss_of(inputs, targets)``, next-token prediction over ``batch``
    (B, T + 1)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs, targets = batch[:, :-1].contiguous(), batch[:, 1:].contiguous()

    def step() -> None:
        loss = loss_of(inputs, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss.item()

    return step


def cross_entropy_of(model: torch.nn.Module) -> Loss:
    """posbench's loss, as its training loop computes it."""
    return lambda x, y: model(x, targets=y) / y.numel()


def steps_at(
    nanogpt: ModuleType, n_layer: int, d_model: int, encodings: list[str], seq_len: int, batch: int
) -> dict[str, Callable[[], None]]:
    """The training steps of nanoGPT and of posbench with each of ``encodings`` at one shape."""
    torch.manual_seed(0)
    data = torch.randint(0, VOCAB, (batch, seq_len + 1))
    config = nanogpt.GPTConfig(
        block_size=seq_len, vocab_size=VOCAB, n_layer=n_layer, n_head=N_HEAD, n_embd=d_model,
        dropout=0.0, bias=False,
    )  # fmt: skip
    reference = nanogpt.GPT(config)
    # With targets nanoGPT's forward computes every position's logits and the loss itself.
    steps = {"nanogpt": training_step(reference, lambda x, y: reference(x, y)[1], data)}
    model_config = {"n_layer": n_layer, "n_head": N_HEAD, "d_model": d_model, "dropout": 0.0}
    for encoding in encodings:
        model = build_model(model_config, trained_encoding(encoding, seq_len, seq_len))
        steps[encoding] = training_step(model, cross_entropy_of(model), data)
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nanogpt", type=Path, required=True, help="nanoGPT's model.py")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--shapes", nargs="+", default=["4x256", "4x128"], help="LAYERSxD_MODEL")
    parser.add_argument("--encodings", nargs="+", default=["none", "rope", "alibi"])
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    nanogpt = load_nanogpt(args.nanogpt)
    tokens = args.batch * args.seq_len
    print(f"threads={args.threads} train {args.batch}x{args.seq_len}, fp32, {N_HEAD} heads")
    print(f"{'shape':<8}{'model':<10}{'tok/s':>10}{'vs nanoGPT':>12}")
    for shape in args.shapes:
        n_layer, d_model = (int(n) for n in shape.split("x"))
        steps = steps_at(nanogpt, n_layer, d_model, args.encodings, args.seq_len, args.batch)
        seconds = median_seconds(steps, args.rounds)
        for name, value in seconds.items():
            ratio = seconds["nanogpt"] / value
            print(f"{shape:<8}{name:<10}{tokens / value:>10,.0f}{ratio:>12.3f}")


if __name__ == "__main__":
    main()
