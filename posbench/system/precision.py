"""Numeric precision and torch.compile: the runtime choices the training loop and evaluation
call, kept out of the loop itself.

* ``train.precision``: ``fp32``, ``bf16`` or ``auto``. bf16 is autocast for the forward pass
  and the loss: matrix products run in bfloat16 while the weights, their gradients and the
  optimizer state stay float32 (bf16 keeps fp32's exponent range, so no loss scaling is
  needed). ``auto`` resolves to bf16 only where it was measured faster (``BF16_MIN_D_MODEL``).
* ``eval.precision``: ``fp32`` (default) or ``bf16``, the same autocast around evaluation's
  forward passes; log-probabilities are always taken and summed in float32/float64.
* ``train.compile``: ``torch.compile`` of the model for the training steps, compiled once
  before the first step so that its time is reported apart from the steady-state tokens/s.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
from torch import nn

log = logging.getLogger(__name__)

# Where auto picks bf16: hardware with bf16 matrix units -> the smallest model width
# (model.d_model) at which bf16 training steps were measured faster than fp32 (T=128, batch 32;
# benchmarks/precision.py measures the ratio). Narrower models stay fp32: their matrices are
# too small for bf16's faster products to pay for the casts autocast adds.
# - avx512_bf16 (AMD EPYC Zen 4, no AMX; interleaved rounds on a busy shared machine, so
#   indicative only): bf16 / fp32 tokens/s 1.6x at tiny (d128; 1.4x with 2 threads), 1.9x at
#   small (d256), 2.9x at base (d512): every shipped size wins, so from d128 on.
# - amx (Intel Xeon, AMX-BF16; issue 57, 2026-12-06, one thread pinned, other jobs running,
#   ratios interleaved in one run, three runs): bf16 trained 1.62x fp32 at tiny (d128), 2.03x
#   at small, 2.63x at base, with posbench's bf16 attention (plain autocast had been 0.85x at
#   d128: SDPA's bf16 kernel). From d128 on: bf16 at tiny trains to fp32's quality (300 steps,
#   two seeds, validation perplexity bf16 / fp32 1.0017 and 1.0001 on the Zen 4; the bf16
#   arithmetic is the same on both; benchmarks/README.md, "Issue 57 on the CPU").
# - cuda (bf16-capable GPUs): on an H200 (torch 2.11, 2026-12-04, benchmarks/gpu_check.py) the
#   default tiny model (d128) trained RoPE at 0.85x fp32's tokens/s in bf16: at that size a step
#   is launch-bound, and autocast adds cast kernels. Wider models were not timed in fp32 there;
#   from small (d256) on, bf16, what tensor cores are built for, with half the bytes to move.
BF16_MIN_D_MODEL = {"avx512_bf16": 128, "amx": 128, "cuda": 256}


def bf16_hardware(device: torch.device) -> str | None:
    """Which bf16 matrix unit ``device`` has: "cuda", "amx", "avx512_bf16", or None (bf16 then
    runs emulated, slower than fp32). Detected, never assumed: machines differ between runs."""
    if device.type == "cuda":
        return "cuda" if torch.cuda.is_bf16_supported() else None
    if device.type != "cpu":
        return None
    capabilities = torch.cpu.get_capabilities()
    if capabilities.get("amx_bf16"):
        return "amx"
    if capabilities.get("avx512_bf16"):
        return "avx512_bf16"
    return None


def resolve_precision(requested: str, device: torch.device, d_model: int) -> str:
    """The precision a run uses: ``requested`` itself, or for ``auto`` bf16 where it was measured
    faster for a model of width ``d_model`` on this device (``BF16_MIN_D_MODEL``), else fp32."""
    hardware = bf16_hardware(device)
    if requested == "bf16" and hardware is None:
        log.warning(
            "bf16 requested but %s has no bf16 matrix unit: expect it slower than fp32", device
        )
    if requested != "auto":
        return requested
    if hardware is not None and d_model >= BF16_MIN_D_MODEL[hardware]:
        return "bf16"
    return "fp32"


def autocast(precision: str, device: torch.device) -> AbstractContextManager:
    """The context a forward pass (and its loss) runs in: bf16 autocast, or nothing for fp32."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def compile_for_training(
    model: nn.Module, tokens: torch.Tensor, precision: str, varying_shape: bool = False
) -> tuple[Callable[[torch.Tensor], torch.Tensor], float]:
    """``torch.compile(model)`` and the seconds it took to compile, for training batches shaped
    like ``tokens`` (B, T), or of any (rows, width) with ``varying_shape`` (a task's batches
    run in width slices of many shapes: width_slices).

    Compilation is lazy (it happens at the first call), so one forward and backward pass on
    ``tokens``, with the loss as training computes it, triggers it here, apart from the timed
    steps; the gradients it leaves are cleared and the random state (dropout) is restored, so
    training draws the same numbers as without this warm-up. Evaluation keeps calling ``model``
    itself: its changing lengths and eval mode would each compile anew.

    dynamo's caches are emptied first, as a fresh process has them: a multirun's jobs train in
    one process (Hydra's basic launcher), and the graphs the earlier jobs' models compiled for
    the same code (Transformer.forward, Block.forward) counted toward its recompile limit, past
    which a later job trained uncompiled, saying so only in a warning (in a sweep over the
    encodings, from the 13th on).
    """
    torch._dynamo.reset()
    compiled = torch.compile(model)
    # Targets of the training batch's shape, and not ``tokens`` itself: dynamo guards on that
    # aliasing, and the steps' targets (never their inputs) would compile it again.
    targets = torch.zeros_like(tokens)
    if varying_shape:
        # Both dimensions symbolic from the warm-up on: else it compiles a graph for its own
        # shape, and the first step of another shape compiles a dynamic one besides.
        for tensor, dim in itertools.product((tokens, targets), (0, 1)):
            torch._dynamo.maybe_mark_dynamic(tensor, dim)
    started = time.perf_counter()
    with torch.random.fork_rng(devices=[tokens.device] if tokens.is_cuda else []):
        with autocast(precision, tokens.device):
            loss = compiled(tokens, targets=targets)
        loss.backward()
    model.zero_grad(set_to_none=True)
    return compiled, time.perf_counter() - started
