"""bf16 and torch.compile: training speed, model FLOPs utilisation, attention, and perplexity.

    python benchmarks/precision.py speed     [--models tiny,small,base] [--threads 1] [--rounds 10]
    python benchmarks/precision.py attention [--threads 1] [--rounds 20]
    python benchmarks/precision.py quality   [--model small] [--steps 300] [--data synthetic]

``speed``: steady-state training tokens/s of each variant at T=128, batch 32 (posbench's own
training step), timed in interleaved rounds after warm-up steps; the ratio to fp32 is the median
of the per-round ratios. Variants: fp32; bf16 (train.precision=bf16); bf16-sdpa (plain autocast:
bf16 with SDPA's attention kernel, the baseline the bf16 attention path replaces); bf16-fused
(fused AdamW); bf16-compile (train.compile; its compile time is printed apart); any
"<precision>-compile" or "<precision>-fused" works the same, e.g. fp32-compile; fp32-mkldnn
(fp32 with ``torch.backends.mkldnn.matmul.fp32_precision = "bf16"``, PyTorch >= 2.9: oneDNN
may run fp32 matrix products in bf16, without autocast). MFU = achieved
model FLOP/s / peak matmul FLOP/s of the same dtype, measured in this process (a 2048^2 matmul;
none for bf16 without bf16 hardware, whose products are emulated):
model FLOPs per token = 6 N + 12 L d T (PaLM's count: N parameters, L layers, width d, context
T; the causal half of attention is counted too). Also prints what train.precision=auto picks.

``attention``: forward + backward of causal attention at each model's shape (32, H, 128, hs):
SDPA in fp32 and bf16, and posbench's bf16 path, as ratios to SDPA fp32; then the same with
ALiBi's causal bias as SDPA's float mask ("-mask": in the inputs' dtype for SDPA, float32 for
posbench's path, as a bias of the distance takes it).

``quality``: final validation perplexity of the same seed trained in fp32 and in bf16
(target: within 2 %); ``--mkldnn``: and in fp32-mkldnn.

``--quick`` checks that a command runs (tiny model, batch 4, two rounds, a few steps, small
peak products); its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from throughput import interleaved_seconds

import posbench.model.attention
from posbench.config import compose_config
from posbench.data import Corpus
from posbench.encodings.alibi import alibi_slopes
from posbench.model import build_model
from posbench.model.attention import unbiased_causal_attention
from posbench.model.attention.fused import fused_attention
from posbench.system.precision import bf16_hardware, compile_for_training, resolve_precision
from posbench.training.train import make_optimizer, train
from posbench.training.train_loop import train_step

MODELS = ("tiny", "small", "base")
VARIANTS = ("fp32", "bf16", "bf16-sdpa", "bf16-fused", "bf16-compile")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def ratio_to(times: dict[str, list[float]], baseline: str, name: str) -> float:
    """Median over rounds of baseline time / ``name``'s time: > 1 means faster."""
    return statistics.median(b / t for b, t in zip(times[baseline], times[name], strict=True))


def peak_matmul_flops(dtype: torch.dtype, size: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of a size x size matmul in ``dtype`` (best of ``repeats``, after a warm-up)."""
    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    a @ b
    best = min(timed(lambda: a @ b) for _ in range(repeats))
    return 2 * size**3 / best


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def sdpa_attention(q, k, v, dropout=0.0):
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)


def alibi_causal_mask(n_head: int, length: int) -> torch.Tensor:
    """ALiBi's bias with the causal mask, float32 -> (1, H, T, T)."""
    distance = torch.arange(length)[:, None] - torch.arange(length)[None, :]  # (T, T)
    bias = -alibi_slopes(n_head).float()[:, None, None] * distance  # (H, T, T)
    return torch.where(distance < 0, float("-inf"), bias)[None]


def sdpa_masked(q, k, v, mask):
    """SDPA with ``mask`` in q's dtype (as SDPA takes a float mask)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype))


@contextmanager
def mkldnn_bf16_matmul(enabled: bool) -> Iterator[None]:
    """fp32 matrix products that oneDNN may run in bf16 while active (``enabled``)."""
    before = torch.backends.mkldnn.matmul.fp32_precision
    torch.backends.mkldnn.matmul.fp32_precision = "bf16" if enabled else before
    try:
        yield
    finally:
        torch.backends.mkldnn.matmul.fp32_precision = before


def training_step(model_name: str, variant: str, seq_len: int, batch: int) -> tuple:
    """(step, compile seconds, model FLOPs per token, precision) of one variant."""
    cfg = compose_config(
        [f"model={model_name}", f"train.seq_len={seq_len}", f"train.batch_size={batch}"]
    )
    precision = variant.split("-")[0]
    torch.manual_seed(0)
    model = build_model(cfg.model, cfg.encoding).train()
    optimizer = make_optimizer(model, cfg.train)
    if variant.endswith("fused"):
        groups = [{**group, "fused": True} for group in optimizer.param_groups]
        optimizer = torch.optim.AdamW(groups)
    stepper, compile_s = model, 0.0
    if variant.endswith("compile"):
        batch_shape = torch.zeros(batch, seq_len, dtype=torch.long)
        stepper, compile_s = compile_for_training(model, batch_shape, precision)
    # Random bytes: the step's cost does not depend on what they say.
    tokens = np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8)
    data = Corpus("random", train=tokens, val=tokens)
    sampler = torch.Generator().manual_seed(0)
    counter = iter(range(1 << 30))

    def step() -> None:
        # bf16-sdpa: the plain autocast, with SDPA's kernel in place of the bf16 path
        swap = swapped_attention() if variant.endswith("sdpa") else nullcontext()
        with swap, mkldnn_bf16_matmul(variant.endswith("mkldnn")):
            train_step(stepper, optimizer, data, sampler, next(counter), cfg.train, precision)

    m = cfg.model
    flops_per_token = 6 * model.num_parameters() + 12 * m.n_layer * m.d_model * seq_len
    return step, compile_s, flops_per_token, precision


@contextmanager
def swapped_attention() -> Iterator[None]:
    """posbench.model.attention's bf16 attention path replaced by SDPA while active."""
    posbench.model.attention.unbiased_causal_attention = sdpa_attention
    try:
        yield
    finally:
        posbench.model.attention.unbiased_causal_attention = unbiased_causal_attention


def speed(args: argparse.Namespace) -> None:
    device = torch.device("cpu")
    # Only the dtypes the variants train in: without bf16 hardware a bf16 product of 2048² takes
    # minutes. --quick measures small products: its numbers mean nothing.
    used = {variant.split("-")[0] for variant in args.variants}
    size = 256 if args.quick else 2048
    peaks = {name: peak_matmul_flops(dtype, size) for name, dtype in DTYPES.items() if name in used}
    hardware = bf16_hardware(device)
    print(f"threads={args.threads} bf16 hardware: {hardware}")
    print(
        ", ".join(f"peak {name} matmul {flops / 1e9:,.1f} GFLOP/s" for name, flops in peaks.items())
    )
    tokens = args.batch * args.seq_len
    for model_name in args.models:
        variants = {
            v: training_step(model_name, v, args.seq_len, args.batch) for v in args.variants
        }
        steps = {v: parts[0] for v, parts in variants.items()}
        interleaved_seconds(steps, args.warmup)
        times = interleaved_seconds(steps, args.rounds)
        d_model = compose_config([f"model={model_name}"]).model.d_model
        auto = resolve_precision("auto", device, d_model)
        print(f"\nmodel={model_name}: auto picks {auto}")
        print(f"{'variant':<14}{'tok/s':>10}{'vs fp32':>9}{'MFU':>7}{'compile s':>11}")
        for name, (_, compile_s, flops_per_token, precision) in variants.items():
            seconds = statistics.median(times[name])
            mfu = tokens * flops_per_token / seconds / peaks[precision]
            # Without bf16 hardware a bf16 "peak" is an emulation's: no utilisation of a unit.
            mfu_text = f"{mfu:>7.1%}" if precision == "fp32" or hardware else f"{'-':>7}"
            ratio = ratio_to(times, args.variants[0], name)
            print(f"{name:<14}{tokens / seconds:>10,.0f}{ratio:>9.2f}{mfu_text}{compile_s:>11.1f}")
        if {"fp32", "bf16"} <= times.keys():
            faster = min(("fp32", "bf16"), key=lambda name: statistics.median(times[name]))
            print(f"auto ({auto}) / faster ({faster}): {ratio_to(times, faster, auto):.2f}")


def attention(args: argparse.Namespace) -> None:
    kernels = {
        "sdpa-fp32": (sdpa_attention, torch.float32),
        "sdpa-bf16": (sdpa_attention, torch.bfloat16),
        "posbench-bf16": (unbiased_causal_attention, torch.bfloat16),
    }
    print(f"threads={args.threads}: causal attention forward + backward, ratio to sdpa-fp32")
    for model_name in args.models:
        m = compose_config([f"model={model_name}"]).model
        shape = (args.batch, m.n_head, args.seq_len, m.d_model // m.n_head)
        mask = alibi_causal_mask(m.n_head, args.seq_len)
        masked = {
            "sdpa-fp32-mask": (partial(sdpa_masked, mask=mask), torch.float32),
            "sdpa-bf16-mask": (partial(sdpa_masked, mask=mask), torch.bfloat16),
            "posbench-bf16-mask": (partial(fused_attention, mask=mask), torch.bfloat16),
        }
        steps = {}
        for name, (kernel, dtype) in {**kernels, **masked}.items():
            q, k, v = (torch.randn(shape, dtype=dtype, requires_grad=True) for _ in range(3))
            grad = torch.randn(shape, dtype=dtype)
            steps[name] = lambda kernel=kernel, q=q, k=k, v=v, grad=grad: kernel(q, k, v).backward(
                grad
            )
        interleaved_seconds(steps, args.warmup)
        times = interleaved_seconds(steps, args.rounds)
        cells = [
            f"{name} {statistics.median(times[name]) * 1e3:.1f} ms "
            f"({ratio_to(times, 'sdpa-fp32', name):.2f}x)"
            for name in steps
        ]
        print(f"model={model_name} {shape}: " + ", ".join(cells))


def quality(args: argparse.Namespace) -> None:
    print(f"model={args.model} data={args.data} steps={args.steps} seed={args.seed}")
    ppl = {}
    variants = ("fp32", "bf16", "fp32-mkldnn") if args.mkldnn else ("fp32", "bf16")
    with tempfile.TemporaryDirectory() as scratch:
        for variant in variants:
            precision = variant.split("-")[0]
            overrides = [
                f"model={args.model}",
                f"data={args.data}",
                f"train.steps={args.steps}",
                f"train.val_every={args.steps}",
                f"train.precision={precision}",
                f"seed={args.seed}",
                "train.checkpoint_every=0",
                "eval.lengths=[128]",
                *args.overrides,
            ]
            with mkldnn_bf16_matmul(variant.endswith("mkldnn")):
                results = train(compose_config(overrides), Path(scratch) / variant)
            ppl[variant] = results["train"]["val_ppl"]
            print(f"{variant}: validation ppl {ppl[variant]:.4f}")
    for variant in variants[1:]:
        ratio = ppl[variant] / ppl["fp32"]
        print(f"{variant} / fp32: {ratio:.4f} (target within 2 %: 0.98-1.02)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("figure", choices=["speed", "attention", "quality"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--models", type=lambda text: text.split(","), default=list(MODELS))
    parser.add_argument("--variants", type=lambda text: text.split(","), default=list(VARIANTS))
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    parser.add_argument("--model", default="small", help="quality: the model trained")
    parser.add_argument("--data", default="synthetic", help="quality: the corpus")
    parser.add_argument("--steps", type=int, default=300, help="quality: training steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mkldnn", action="store_true", help="quality: fp32-mkldnn too")
    parser.add_argument("--quick", action="store_true", help="check that it runs")
    parser.add_argument("overrides", nargs="*", help="quality: more posbench overrides")
    args = parser.parse_args()
    if args.quick:
        args.models, args.model, args.rounds, args.warmup, args.steps = ["tiny"], "tiny", 2, 1, 4
        args.batch = 4
    torch.set_num_threads(args.threads)
    {"speed": speed, "attention": attention, "quality": quality}[args.figure](args)


if __name__ == "__main__":
    main()
