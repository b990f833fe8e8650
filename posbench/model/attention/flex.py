"""``flex_attention_bias``: a bias of the distance alone at consecutive positions in one compiled
flex_attention kernel (on FLEX_ATTENTION_DEVICES: CUDA), its table read inside the kernel and the
future key blocks skipped.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from posbench.system.dynamo import raised_recompile_limits

if TYPE_CHECKING:  # importing flex_attention imports torch._dynamo: seconds per process start
    from torch.nn.attention.flex_attention import BlockMask


def flex_attention_bias(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, compiled: bool = True
) -> torch.Tensor:
    """relative_bias_attention's result from one flex_attention call (FlexAttention, Dong et al.
    2024, https://arxiv.org/abs/2412.05496): q, k, v (B, H, T, hs) at consecutive positions and
    the bias table ``bias[h, i - j]`` at distances 0..T-1 (H, T), or ``bias[b, h, i - j]``
    (B, H, T) with a row per sequence (randomized distances) -> (B, H, T, hs).

    Its score_mod adds the table entry of each score's distance inside the fused kernel, and a
    causal BlockMask skips the key blocks wholly in a query block's future: no scores or bias of
    (T, T) are written, forward or backward, and a learned table (T5, KERPLE) gets its gradient
    through the lookup. The table stays float32 under bf16 autocast: rounded to bf16, ALiBi's
    flattest head's bias at 16,384 tokens (about -64) could move by 0.25. ``compiled=False``
    runs flex_attention's unfused implementation (tests), which writes the (B, H, T, T) scores.
    """
    from torch.nn.attention.flex_attention import flex_attention

    table = bias.float()  # ([B,] H, T)
    per_sequence = table.dim() == 3

    def add_bias(
        score: torch.Tensor,
        b: torch.Tensor,
        h: torch.Tensor,
        q_idx: torch.Tensor,
        kv_idx: torch.Tensor,
    ) -> torch.Tensor:
        # Future keys (negative distances) are masked by the block mask; clamped, their lookup
        # stays inside the table.
        distance = (q_idx - kv_idx).clamp(min=0)
        return score + (table[b, h, distance] if per_sequence else table[h, distance])

    # In a compiled model (train.compile) the model's compilation fuses flex_attention itself.
    fused = compiled and not torch.compiler.is_compiling()
    attention = compiled_flex_attention() if fused else flex_attention
    # The mask is built eagerly (and cached) even when called from a compiled model.
    mask = torch.compiler.disable(causal_block_mask)(q.shape[2], q.device)
    options = HALF_PRECISION_KERNEL_OPTIONS if q.is_cuda and q.element_size() == 2 else None
    return attention(q, k, v, score_mod=add_bias, block_mask=mask, kernel_options=options)


# flex_attention's CUDA block sizes for bf16 and fp16 inputs (forward: BLOCK_M queries by BLOCK_N
# keys; backward: BLOCK_M1 x BLOCK_N1 and BLOCK_M2 x BLOCK_N2). torch's default for heads of 64
# on an H100/H200 (128 x 128, 3 stages) needs 245,760 bytes of shared memory with the score_mod
# above, more than the chip's 232,448: the kernel failed to compile (torch 2.11, H200,
# 2026-12-04, model=small). These blocks, 2 stages, fit every head size up to 128. Float32 keeps
# torch's defaults, already sized for its 4-byte elements.
HALF_PRECISION_KERNEL_OPTIONS = {
    "BLOCK_M": 64,
    "BLOCK_N": 64,
    "BLOCK_M1": 32,
    "BLOCK_N1": 64,
    "BLOCK_M2": 64,
    "BLOCK_N2": 32,
    "num_stages": 2,
    "num_warps": 4,
}


# How many kernels torch.compile may keep for flex_attention (dynamo's default is 8 per function,
# past which it runs the function uncompiled). A run meets one shape per length, batch size,
# dtype and grad mode: training, validation, and at each evaluation length its full batches and
# its last one.
FLEX_RECOMPILE_LIMIT = 128


@functools.cache
def compiled_flex_attention() -> Callable[..., torch.Tensor]:
    """flex_attention compiled once per process: uncompiled, it writes the whole (B, H, T, T)
    scores. torch.compile caches a kernel per score_mod code and input shapes, so every layer
    and step reuses it.

    Static shapes (``dynamic=False``): a kernel per shape, never one for any length. The
    dynamic-shape kernel that torch.compile builds once it has seen a second length failed to
    compile on a CPU (torch 2.13) and did not finish compiling in 100 s on an H200 for float32
    heads of 128 (torch 2.11, evaluating model=large at 2,512 tokens, 2026-12-04), where each
    static one took seconds. Raises dynamo's recompile limit to FLEX_RECOMPILE_LIMIT."""
    from torch.nn.attention.flex_attention import flex_attention

    for name, limit in raised_recompile_limits(FLEX_RECOMPILE_LIMIT).items():
        setattr(torch._dynamo.config, name, limit)
    return torch.compile(flex_attention, dynamic=False)


def causal(
    b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
) -> torch.Tensor:
    """flex_attention's mask_mod of causal attention: a query sees its own and earlier keys."""
    return q_idx >= kv_idx


@functools.lru_cache(maxsize=16)
def causal_block_mask(length: int, device: torch.device) -> BlockMask:
    """The causal BlockMask of ``length`` queries and keys, shared by every batch and head
    (create_block_mask evaluates ``causal`` on the whole (T, T) grid once, hence the cache)."""
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(causal, None, None, length, length, device=device)
