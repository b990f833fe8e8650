"""Score-bias attention: evaluation time at long lengths and training tokens/s, per encoding, as
ratios to NoPE measured in the same process (model: tiny, or --model for train; untrained).

    python benchmarks/bias_attention.py eval [--lengths 2048 16384] [--rounds 5] [--threads 1]
        [--encodings path path-fox]
    python benchmarks/bias_attention.py train [--rounds 15] [--threads 1] [--precision fp32 bf16]
        [--encodings alibi t5] [--model tiny|small|base]
    python benchmarks/bias_attention.py eval --encodings pope alibi-dape    # these and NoPE
    python benchmarks/bias_attention.py layer [--rounds 60]    # explicit attention's blocks
    python benchmarks/bias_attention.py shared [--lengths 2048] [--fire-switches 32]
    python benchmarks/bias_attention.py eval --quick     # a small, fast check that it runs
    python benchmarks/bias_attention.py train --clock cpu    # CPU time: a machine shared

Besides the registered encodings, ``fire-switching`` is FIRE with ``--fire-switches`` (default 8)
of f_theta's 32 switch points inside (0, 1), where an untrained FIRE has none: each costs time
past L (see switch_inside_the_inputs_range; the 15 trained FIRE models of README's sweeps have
0-7 there, 32 is the slowest case). ``general`` is KERPLE's bias given only through
``score_bias`` (looked up at every (query, key) pair; no ``relative_bias``): the path that any
bias without exploitable structure takes. ``hybrid-swa`` is the hybrid with a sliding window of
128 tokens in its RoPE layers (NoPE layers global), ``ssmax`` RoPE with
``model.attention_scaling=ssmax``, ``alibi-dape`` (and kerple's, fire's) the bias with
``encoding.dape=true``, ``path-fox`` PaTH with ``encoding.forget_gate=true`` (VARIANTS).
Models are configured as trained at ``--seq-len`` (default 128, the extrapolation experiments'
length), so FIRE's threshold L is 128: past it, its bias depends on the query's position too
and takes that path. Models are timed in interleaved rounds (one forward or training step of
each per round; median per model; see benchmarks/README.md). Peak memory at 16,384 tokens is
benchmarks/long_eval_memory.py's figure.

``train --precision`` takes one or more of fp32, bf16 and auto (``train.precision``: auto resolved
per model as a run resolves it); the models of every precision are timed in the same interleaved
rounds, each precision's ratios are to NoPE's in that precision, and with fp32 among them each
model's tokens/s is also given as a ratio to its own in fp32.

Two figures behind design constants of posbench/model/attention/: ``layer`` times one attention
layer with a learned bias (T5's), forward and backward at ``--batch`` x ``--seq-len``, with the
explicit computation's blocks of 128, 64, 32 and 16 queries (EXPLICIT_QUERY_BLOCK), next to NoPE's
fused kernel; ``shared`` times one forward pass of fire-switching in each model size with the layers
sharing their query blocks' biases (SHARED_BIAS_ELEMENTS) and without.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from types import ModuleType
from unittest import mock

import torch
from throughput import CLOCKS, median_seconds, trained_encoding

from posbench.config import compose_config
from posbench.encodings import PositionalEncoding, encoding_names
from posbench.encodings.kerple import KerpleConfig, KerpleRelativeBias
from posbench.model import Transformer, build_model
from posbench.model.args import ModelArgs
from posbench.model.attention import biases, blocks
from posbench.system.precision import autocast, resolve_precision

DAPE_BIASES = ("alibi", "kerple", "fire")
# Configurations besides the registered encodings: (encoding overrides, model options).
VARIANTS = {
    "hybrid-swa": (["encoding=hybrid", "encoding.window=128"], {}),  # rope windowed, none global
    "ssmax": (["encoding=rope"], {"attention_scaling": "ssmax"}),
    # DAPE (encoding.dape=true, its default kernel: DAPE V2's 1x3) on each bias it wraps
    **{f"{name}-dape": ([f"encoding={name}", "encoding.dape=true"], {}) for name in DAPE_BIASES},
    "path-fox": (["encoding=path", "encoding.forget_gate=true"], {}),  # PaTH-FoX
}
EVAL_ENCODINGS = (
    "none",
    "alibi",
    "t5",
    "kerple",
    "fire",
    "fire-switching",
    "general",
    "xpos",
    "sandwich",
    "fox",
    "cope",
    "hybrid",
    "hybrid-swa",
    "ssmax",
    "pope",
    *(f"{name}-dape" for name in DAPE_BIASES),
    "path",
    "path-fox",
)
# The issues' targets: eval time at most this many times NoPE's; training tokens/s at least
# TRAIN_TARGET times NoPE's (every encoding but those in TRAIN_TARGETS).
EVAL_TARGETS = {
    "alibi": 2.0,
    "t5": 2.0,
    "kerple": 3.0,
    "fire": 3.0,
    "fire-switching": 3.0,
    "general": 3.0,
    "xpos": 2.0,
    "sandwich": 2.0,
    "fox": 2.0,
    "ssmax": 2.0,
    "cope": 6.0,
    "pope": 3.0,
    **{f"{name}-dape": 3.0 for name in DAPE_BIASES},
    "path": 6.0,
    "path-fox": 6.0,
}
TRAIN_TARGET = 0.91
TRAIN_TARGETS = {
    "xpos": 0.9,
    "sandwich": 0.9,
    "ssmax": 0.9,
    "fox": 0.8,
    "cope": 0.5,
    "pope": 0.8,
    **{f"{name}-dape": 0.5 for name in DAPE_BIASES},
    "path": 0.3,
    "path-fox": 0.3,
}


class GeneralKerple(PositionalEncoding):
    """KERPLE's bias given through score_bias only: the (query, key) grid is looked up from its
    values at each distinct distance, as PositionalEncoding.score_bias does."""

    def __init__(self, config: KerpleConfig, d_model: int, n_head: int) -> None:
        super().__init__(config, d_model, n_head)
        self.kerple = KerpleRelativeBias(config, d_model, n_head)

    def score_bias(
        self,
        query_positions: torch.Tensor,
        key_positions: torch.Tensor,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.kerple.score_bias(query_positions, key_positions, out=out)  # (H, Tq, Tk)


# The shipped model sizes (conf/model/), for the ``shared`` figure.
MODEL_SIZES = {
    "tiny": {},
    "small": {"n_layer": 4, "n_head": 4, "d_model": 256},
    "base": {"n_layer": 6, "n_head": 8, "d_model": 512},
}


def untrained_model(
    encoding: str, length: int, seq_len: int, fire_switches: int = 8, size: str = "tiny"
) -> Transformer:
    """An untrained model (default: tiny, ModelArgs' defaults) with ``encoding`` as configured
    for training at ``seq_len``, for inputs of ``length`` (``fire-switching``: ``fire_switches``
    switch points inside (0, 1))."""
    torch.manual_seed(0)
    model_config = MODEL_SIZES[size]
    if encoding == "general":
        args = ModelArgs(**model_config)
        return Transformer(args, GeneralKerple(KerpleConfig(), args.d_model, args.n_head))
    if encoding in VARIANTS:
        overrides, options = VARIANTS[encoding]
        config = compose_config([*overrides, f"train.seq_len={seq_len}"]).encoding
        return build_model({**model_config, **options}, config)
    if encoding == "fire-switching":
        model = build_model(model_config, trained_encoding("fire", seq_len, length))
        switch_inside_the_inputs_range(model.encoding.mlp[0], fire_switches)
        return model
    return build_model(model_config, trained_encoding(encoding, seq_len, length))


@torch.no_grad()
def switch_inside_the_inputs_range(hidden: torch.nn.Linear, count: int) -> None:
    """Moves the switch points -b/w of ``count`` hidden units of FIRE's f_theta to evenly spaced
    points inside (0, 1), where the inputs of past keys lie (an untrained FIRE has none there),
    rising and falling units in turn: each is a boundary between two of f_theta's linear
    segments that keys cross within a block of queries, the costly part of FIRE's bias."""
    w = torch.tensor([1.0, -1.0]).repeat(count // 2 + 1)[:count]
    hidden.weight[:count, 0] = w
    hidden.bias[:count] = -w * (torch.arange(count) + 0.5) / count


def eval_step(model: Transformer, length: int) -> Callable[[], None]:
    tokens = torch.randint(0, 256, (1, length))

    @torch.inference_mode()
    def step() -> None:
        model(tokens).sum().item()

    return step


def train_step(
    model: Transformer, batch: int, seq_len: int, precision: str = "fp32"
) -> Callable[[], None]:
    """One optimisation step of ``model`` on a random batch, the forward pass and the loss in
    ``precision`` (fp32, bf16 or auto, which resolves as train.precision does)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 256, (batch, seq_len + 1))
    device = x.device
    resolved = resolve_precision(precision, device, model.args.d_model)

    def step() -> None:
        with autocast(resolved, device):
            loss = model(x[:, :-1], targets=x[:, 1:])  # as posbench's training step
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return step


def with_attention_constant(
    step: Callable[[], None], module: ModuleType, name: str, value: int
) -> Callable[[], None]:
    """``step`` run with the constant ``name`` of ``module`` (of posbench.model.attention) set to
    ``value``."""

    def patched() -> None:
        with mock.patch.object(module, name, value):
            step()

    return patched


def layer_step(block: int | None, batch: int, seq_len: int) -> Callable[[], None]:
    """Forward and backward of one tiny attention layer with T5's learned bias, the explicit
    computation in blocks of ``block`` queries (``None``: NoPE, SDPA's fused causal kernel)."""
    model = untrained_model("none" if block is None else "t5", seq_len, seq_len)
    attention, encoding = model.blocks[0].attn, model.encoding
    x = torch.randn(batch, seq_len, model.args.d_model, requires_grad=True)
    positions = torch.arange(seq_len)

    def step() -> None:
        attention(x, positions, encoding).square().mean().backward()

    if block is None:
        return step
    return with_attention_constant(step, blocks, "EXPLICIT_QUERY_BLOCK", block)


def report(title: str, seconds: dict[str, float], targets: dict[str, float], slower: bool) -> None:
    """One line per model: its time as a ratio to NoPE's (``slower``) or its speed as one."""
    print(title)
    for name, value in seconds.items():
        ratio = value / seconds["none"] if slower else seconds["none"] / value
        target = targets.get(name)
        bound = "" if target is None else f"  target {'<=' if slower else '>='} {target:.2f}"
        met = "" if target is None else ("  ok" if (ratio <= target) == slower else "  MISSED")
        print(f"  {name:<15}{value:>9.3f} s{ratio:>7.2f}x{bound}{met}")


def report_against_fp32(
    seconds: dict[tuple[str, str], float], names: list[str], precisions: list[str]
) -> None:
    """Each model's training tokens/s in every precision but fp32 as a ratio to its own in
    fp32 (> 1: faster than fp32)."""
    others = [precision for precision in precisions if precision != "fp32"]
    if not others:
        return
    print("training tokens/s as a ratio to the same model's in fp32")
    print(f"  {'':<15}" + "".join(f"{precision:>8}" for precision in others))
    for name in names:
        ratios = [seconds[name, "fp32"] / seconds[name, precision] for precision in others]
        print(f"  {name:<15}" + "".join(f"{ratio:>7.2f}x" for ratio in ratios))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("figure", choices=["eval", "train", "layer", "shared"])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 16384])
    parser.add_argument("--batch", type=int, default=32, help="training batch")
    parser.add_argument("--seq-len", type=int, default=128, help="training length")
    parser.add_argument(
        "--rounds", type=int, default=None, help="default: eval and shared 5, train 15, layer 60"
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--precision",
        nargs="+",
        choices=["fp32", "bf16", "auto"],
        default=["fp32"],
        help="train: train.precision of the models, one or more (timed in the same rounds)",
    )
    parser.add_argument(
        "--encodings", nargs="+", help="train, eval: these models and none (default: every one)"
    )
    parser.add_argument(
        "--fire-switches", type=int, default=8, help="of fire-switching's 32 units (default 8)"
    )
    parser.add_argument(
        "--model", choices=list(MODEL_SIZES), default="tiny", help="train: the models' size"
    )
    parser.add_argument(
        "--clock",
        choices=list(CLOCKS),
        default="wall",
        help="train, eval: time steps by the wall clock or the process's CPU time (a shared CPU)",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, 1 round")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rounds = args.rounds or {"train": 15, "layer": 60}.get(args.figure, 5)
    if args.quick:
        args.lengths, args.batch, rounds = [512], 4, 1
    models = "models tiny, small, base" if args.figure == "shared" else f"model {args.model}"
    print(f"threads={args.threads}, rounds={rounds}, {models}, clock={args.clock}")
    if args.figure == "eval":
        names = ["none", *args.encodings] if args.encodings else EVAL_ENCODINGS
        for length in args.lengths:
            steps = {
                name: eval_step(
                    untrained_model(name, length, args.seq_len, args.fire_switches), length
                )
                for name in names
            }
            seconds = median_seconds(steps, rounds, args.clock)
            report(f"eval time at {length} tokens (one window)", seconds, EVAL_TARGETS, True)
    elif args.figure == "layer":
        blocks = {"none": None, **{f"t5, blocks of {n}": n for n in (128, 64, 32, 16)}}
        steps = {name: layer_step(n, args.batch, args.seq_len) for name, n in blocks.items()}
        seconds = median_seconds(steps, rounds)
        print(f"one attention layer, forward and backward, at {args.batch} x {args.seq_len}")
        for name, value in seconds.items():
            print(f"  {name:<20}{value * 1e3:>8.1f} ms{value / seconds['none']:>7.2f}x")
    elif args.figure == "shared":
        for length, size in ((n, s) for n in args.lengths for s in MODEL_SIZES):
            model = untrained_model(
                "fire-switching", length, args.seq_len, args.fire_switches, size
            )
            shared = biases.SHARED_BIAS_ELEMENTS
            step = eval_step(model, length)
            steps = {  # the layers sharing up to that many values, or none
                "shared": with_attention_constant(step, biases, "SHARED_BIAS_ELEMENTS", shared),
                "per layer": with_attention_constant(step, biases, "SHARED_BIAS_ELEMENTS", 0),
            }
            seconds = median_seconds(steps, rounds)
            gain = seconds["per layer"] / seconds["shared"]
            print(
                f"{size} at {length} tokens, fire-switching ({args.fire_switches}): shared "
                f"{seconds['shared']:.3f} s, per layer {seconds['per layer']:.3f} s ({gain:.2f}x)"
            )
    else:
        names = ["none", *(n for n in encoding_names() if n != "none"), "general", *VARIANTS]
        if args.encodings:  # NoPE is every ratio's baseline
            names = ["none", *(n for n in args.encodings if n != "none")]
        steps = {
            (name, precision): train_step(
                untrained_model(name, args.seq_len, args.seq_len, size=args.model),
                args.batch,
                args.seq_len,
                precision,
            )
            for precision in args.precision
            for name in names
        }
        seconds = median_seconds(steps, rounds, args.clock)
        targets = {**dict.fromkeys(names, TRAIN_TARGET), **TRAIN_TARGETS}
        d_model = ModelArgs(**MODEL_SIZES[args.model]).d_model
        for precision in args.precision:
            resolved = resolve_precision(precision, torch.device("cpu"), d_model)
            title = f"training tokens/s at {args.batch} x {args.seq_len}, {precision}"
            if precision == "auto":
                title += f" ({resolved})"
            of_precision = {name: seconds[name, precision] for name in names}
            report(title, of_precision, targets, False)
        if "fp32" in args.precision:
            report_against_fp32(seconds, names, args.precision)


if __name__ == "__main__":
    main()
